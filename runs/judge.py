"""Citation extraction from ``doc_html`` and the pluggable judge.

A citation is either an element carrying ``data-source="KEY"`` (its text is the claim) or
a bracket marker ``[KEY]`` / ``[KEY1, KEY2]`` after a sentence (that sentence is the
claim). Markers are numbered ``c1, c2, …`` in document order, so re-extracting the same
document yields the same citations.

The default judge, :class:`OverlapJudge`, is deterministic and offline: it scores how much
of the claim's vocabulary the source's text contains. Another judge (an LLM call, say) is
plugged in with the setting ``RUNS_JUDGE = "dotted.path.ToJudge"``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from runs.exceptions import JudgeError
from runs.models import Verdict

DEFAULT_JUDGE = "runs.judge.OverlapJudge"
_BLOCK_TAGS = frozenset(
    "p li div h1 h2 h3 h4 h5 h6 td th blockquote br section article tr dd dt".split()  # noqa: SIM905
)
_VOID_TAGS = frozenset(
    "br hr img input meta link area base col embed source track wbr".split()  # noqa: SIM905
)
#: Citations one analysis may hold (admission refuses more), and the longest claim kept
#: per citation: a document of one endless sentence must not repeat it per citation.
MAX_CITATIONS = 1000
MAX_CLAIM_CHARS = 1000
_KEY = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}"
_BRACKET = re.compile(rf"\[({_KEY}(?:\s*[,;]\s*{_KEY})*)\]")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    (  # noqa: SIM905
        "the and for are was were that this with from have has had not but its into than "
        "then they their there which who whom been being also can may might such these "
        "those our your his her she him you all any per via"
    ).split()
)


@dataclass(frozen=True, kw_only=True)
class Source:
    key: str
    title: str = ""
    doi: str | None = None
    text: str = ""


@dataclass(frozen=True, kw_only=True)
class Citation:
    marker: str
    source_key: str
    claim: str


@dataclass(frozen=True, kw_only=True)
class Judgement:
    verdict: Verdict
    score: float
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class CitationVerdict:
    marker: str
    source_key: str
    claim: str
    verdict: Verdict
    score: float
    reason: str

    def as_json(self) -> dict[str, object]:
        return {
            "marker": self.marker,
            "source_key": self.source_key,
            "claim": self.claim,
            "verdict": str(self.verdict),
            "score": self.score,
            "reason": self.reason,
        }


class Judge(Protocol):
    name: str

    def judge(self, *, claim: str, source: Source | None) -> Judgement: ...


class _CitationParser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, str]] = []  # (source keys text, claim)
        self._text: list[str] = []
        self._cite_key: str | None = None
        self._cite_text: list[str] = []
        self._cite_depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self._cite_key is not None:
            if tag not in _VOID_TAGS:
                self._cite_depth += 1
            return
        key = dict(attrs).get("data-source")
        if key and tag not in _VOID_TAGS:
            self._flush()
            self._cite_key, self._cite_text, self._cite_depth = key.strip(), [], 1
        elif tag in _BLOCK_TAGS:
            self._flush()

    def handle_endtag(self, tag: str) -> None:
        if self._cite_key is not None:
            self._cite_depth -= 1
            if self._cite_depth == 0:
                self.found.append((self._cite_key, _squash("".join(self._cite_text))))
                self._cite_key = None
            return
        if tag in _BLOCK_TAGS:
            self._flush()

    def handle_data(self, data: str) -> None:
        (self._cite_text if self._cite_key is not None else self._text).append(data)

    def close(self) -> None:
        super().close()
        if self._cite_key is not None:
            self.found.append((self._cite_key, _squash("".join(self._cite_text))))
            self._cite_key = None
        self._flush()

    def _flush(self) -> None:
        text = _squash("".join(self._text))
        self._text = []
        if not text:
            return
        for sentence in _SENTENCE_END.split(text):
            for match in _BRACKET.finditer(sentence):
                claim = _squash(_BRACKET.sub("", sentence))
                self.found.append((match.group(1), claim))


def _squash(text: str) -> str:
    return _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))


def extract_citations(doc_html: str) -> list[Citation]:
    """The document's citations in order (pure; the same input gives the same markers)."""
    parser = _CitationParser()
    parser.feed(doc_html)
    parser.close()
    citations = []
    for keys, claim in parser.found:
        for key in re.split(r"\s*[,;]\s*", keys):
            if key:
                citations.append(
                    Citation(
                        marker=f"c{len(citations) + 1}",
                        source_key=key[:64],
                        claim=claim[:MAX_CLAIM_CHARS],
                    )
                )
    return citations


def _vocabulary(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) >= 3 and w not in _STOPWORDS}


class OverlapJudge:
    """Scores the share of the claim's words found in the source's title and text:
    ≥ 0.6 supported, ≥ 0.3 partial, else unsupported. Deterministic and offline."""

    name = "overlap-v1"
    supported_at = 0.6
    partial_at = 0.3

    def judge(self, *, claim: str, source: Source | None) -> Judgement:
        if source is None:
            return Judgement(
                verdict=Verdict.MISSING_SOURCE,
                score=0.0,
                reason="no source with this key was attached",
            )
        words = _vocabulary(claim)
        if not words:
            return Judgement(
                verdict=Verdict.UNSUPPORTED, score=0.0, reason="the claim has no checkable words"
            )
        found = words & _vocabulary(f"{source.title} {source.text}")
        score = round(len(found) / len(words), 3)
        if score >= self.supported_at:
            verdict = Verdict.SUPPORTED
        elif score >= self.partial_at:
            verdict = Verdict.PARTIAL
        else:
            verdict = Verdict.UNSUPPORTED
        return Judgement(
            verdict=verdict,
            score=score,
            reason=f"{len(found)} of {len(words)} claim words in the source",
        )


def get_judge() -> Judge:
    """The configured judge (``RUNS_JUDGE``), or the offline default."""
    return import_string(getattr(settings, "RUNS_JUDGE", DEFAULT_JUDGE))()


def judge_document(
    *, doc_html: str, sources: Sequence[Mapping[str, object]], judge: Judge | None = None
) -> list[CitationVerdict]:
    """Extract the citations of ``doc_html`` and judge each against its source.

    Raises :class:`JudgeError` when the document has no citations (admission refuses
    such documents, so the job's input is broken) or the judge declares one unjudgeable.
    """
    judge = judge or get_judge()
    by_key = {
        str(s["key"]): Source(
            key=str(s["key"]),
            title=str(s.get("title") or ""),
            doi=s.get("doi") or None,
            text=str(s.get("text") or ""),
        )
        for s in sources
    }
    citations = extract_citations(doc_html)
    if not citations:
        raise JudgeError("the document holds no citations")
    verdicts = []
    for citation in citations:
        # Only JudgeError is final; anything else a judge raises (a timeout of a remote
        # judge, say) propagates so the task is retried.
        judgement = judge.judge(claim=citation.claim, source=by_key.get(citation.source_key))
        verdicts.append(
            CitationVerdict(
                marker=citation.marker,
                source_key=citation.source_key,
                claim=citation.claim,
                verdict=judgement.verdict,
                score=judgement.score,
                reason=judgement.reason,
            )
        )
    return verdicts


def summarize(verdicts: Sequence[Mapping[str, object]]) -> dict[str, int]:
    """Counts per verdict plus the total (for results and run diagnostics)."""
    counts = {str(v): 0 for v in Verdict}
    for verdict in verdicts:
        key = str(verdict.get("verdict"))
        counts[key] = counts.get(key, 0) + 1
    counts["citations"] = len(verdicts)
    return counts
