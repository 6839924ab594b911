"""Citation extraction from ``doc_html`` and the pluggable judge.

The document is parsed as a browser parses it (selectolax's Lexbor engine follows the
HTML5 parsing rules: optional end tags, implied elements, the first of duplicate
attributes wins), and its text is laid out as blocks (paragraphs, list items, cells,
headings, line breaks …); scripts, styles, templates, form fields and comments are no
text. Then:

* every element carrying ``data-source="KEY"`` (or ``"K1, K2"``) cites its keys, nested
  ones included; its text, markers removed, is the claim; a void element cites nothing;
* every bracket marker ``[KEY]`` / ``[K1, K2; K3]`` cites the sentence it stands in —
  or, when it opens a sentence (nothing but space and markers before it there), the
  sentence before it in its block: ``…scattering. [s1] Grass…`` cites "…scattering.";
  a block of markers alone (``<p>[s1]</p>`` between paragraphs) cites the last
  sentence of the last block before it that has words; with none before it, the marker
  is unattached: its claim is empty (the default judge: unsupported, "the claim has no
  checkable words");
* a key matches its source's key in any case (``[S1]`` cites source ``s1``; the API
  refuses two source keys that differ only in case);
* ``[sic]`` (any case) is an editorial note, never a citation;
* a sentence ends after ``.``, ``!``, ``?`` or ``…`` (and closing quotes) followed by space
  or by a marker's ``[`` (``…blue.[s1] Grass``), unless the next word starts in lower
  case, or the word is an abbreviation (``e.g.``, ``i.e.``, ``cf.``, ``et al.``,
  ``Dr.``, ``Fig.`` …, see ``_ABBREVIATIONS``) or an initial (``J.``, ``U.S.``); a block
  always ends one.

Citations are numbered ``c1, c2, …`` in document order (an element at its start, a
marker where it stands), so re-extracting the same document yields the same citations.
Claims are squashed to single spaces and cut at ``MAX_CLAIM_CHARS``. Every step is
linear in the document's size and none recurses, whatever its nesting.
``tests/runs/test_judge.py`` holds the rules as a table of cases.

The default judge, :class:`OverlapJudge`, is deterministic and offline: it scores how much
of the claim's vocabulary the source's text contains. Another judge (an LLM call, say) is
plugged in with the setting ``RUNS_JUDGE = "dotted.path.ToJudge"``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache, partial
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string
from selectolax.lexbor import LexborHTMLParser, LexborNode

from runs.exceptions import JudgeError
from runs.models import Verdict

DEFAULT_JUDGE = "runs.judge.OverlapJudge"
_BLOCK_TAGS = frozenset(
    (  # noqa: SIM905
        "address article aside blockquote body br dd details dialog div dl dt fieldset "
        "figcaption figure footer form h1 h2 h3 h4 h5 h6 header hr li main nav ol p pre "
        "section summary table tbody td tfoot th thead tr ul caption"
    ).split()
)
_VOID_TAGS = frozenset(
    "br hr img input meta link area base col embed source track wbr".split()  # noqa: SIM905
)
#: Elements whose text is no prose of the document.
_SKIPPED_TAGS = frozenset(
    "script style template noscript textarea select option head title iframe".split()  # noqa: SIM905
)
#: Bracketed editorial notes that look like a key but cite nothing.
_EDITORIAL = frozenset({"sic"})
#: Words ending in a period that end no sentence (lower case).
_ABBREVIATIONS = frozenset(
    (  # noqa: SIM905
        "e.g. i.e. cf. vs. viz. al. approx. ca. fig. figs. no. nos. p. pp. vol. ch. sec. "
        "eq. ed. eds. dr. mr. mrs. ms. prof. st. jr. sr. resp. incl. esp. z.b. bzw. usw. "
        "d.h. u.a. vgl. ggf. etc."
    ).split()
)
#: Citations one analysis may hold (admission refuses more), and the longest claim kept
#: per citation: a document of one endless sentence must not repeat it per citation.
MAX_CITATIONS = 1000
MAX_CLAIM_CHARS = 1000
#: Separates blocks in the laid-out text (the parser turns NUL into U+FFFD, so no text
#: holds it).
_BREAK = "\x00"
_KEY = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}"
_BRACKET = re.compile(rf"\[({_KEY}(?:\s*[,;]\s*{_KEY})*)\]")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,;:!?])")
#: A sentence's end: its punctuation (and closing quotes) before space or a marker's
#: bracket ("…blue.[s1] Grass", "…blue.<sup>[1]</sup> Grass").
_SENTENCE_END = re.compile(r"([.!?\u2026])[\"'\u201d\u2019)]*(?=\s|\[)")
_NEXT_WORD = re.compile(r"\s*(\S)")
_LEADING_MARKERS = re.compile(rf"(?:\s|{_BRACKET.pattern})*")
_LONGEST_ABBREVIATION = 12
_CLAIM_WINDOW = 4 * MAX_CLAIM_CHARS
#: An initial, or an abbreviation of initials ("J.", "U.S.", "e.u.").
_INITIAL = re.compile(r"(?:[a-z]\.)+")
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


def _walk(body: LexborNode) -> tuple[str, list[tuple[int, int, str]]]:
    """The document's text as a browser lays it out (blocks separated by ``_BREAK``,
    skipped elements left out) and each ``data-source`` element as (start, end, keys) in
    that text. Iterative: a deeply nested document cannot exhaust the stack."""
    parts: list[str] = []
    length = 0
    cited: list[tuple[int, int, str]] = []
    stack: list[tuple[LexborNode, bool, int]] = [(body, False, -1)]  # (node, leaving, start)
    while stack:
        node, leaving, cite_start = stack.pop()
        tag = node.tag
        if leaving:
            if cite_start >= 0:
                keys = node.attributes.get("data-source") or ""
                cited.append((cite_start, length, keys))
            if tag in _BLOCK_TAGS:
                parts.append(_BREAK)
                length += 1
            continue
        if tag == "-text":
            text = node.text_content or ""
            parts.append(text.replace(_BREAK, " "))
            length += len(text)
            continue
        if tag.startswith("-") or tag in _SKIPPED_TAGS:
            continue  # comments, and elements whose text is no prose
        if tag in _BLOCK_TAGS:
            parts.append(_BREAK)
            length += 1
        key = (node.attributes.get("data-source") or "").strip()
        stack.append((node, True, length if key and tag not in _VOID_TAGS else -1))
        children = []
        child = node.child
        while child is not None:
            children.append(child)
            child = child.next
        stack.extend((c, False, -1) for c in reversed(children))
    return "".join(parts), cited


def _is_editorial(keys: str) -> bool:
    return keys.strip().lower() in _EDITORIAL


def _sentence_ends(block: str) -> list[int]:
    """Where each sentence of ``block`` ends (exclusive): after ``.``, ``!``, ``?`` or ``…``
    (and closing quotes) followed by space or ``[``, unless the word is an abbreviation or an
    initial, or the next word starts in lower case. Linear in the block's length."""
    ends = []
    for match in _SENTENCE_END.finditer(block):
        # The next word, past any markers: "p.m.[s1] and" goes on.
        following = _NEXT_WORD.match(block, _LEADING_MARKERS.match(block, match.end()).end())
        if following and following.group(1).islower():
            continue
        if match.group(1) == ".":
            start = match.start()
            word = start
            while word > max(0, start - _LONGEST_ABBREVIATION) and not block[word - 1].isspace():
                word -= 1
            token = block[word : start + 1].lstrip("([{\"'\u201c\u2018").lower()
            if token in _ABBREVIATIONS or _INITIAL.fullmatch(token):
                continue
        ends.append(match.end())
    ends.append(len(block))
    return ends


def _claim(text: str) -> str:
    """A claim: the text without its citation markers, spaces squashed, at most
    ``MAX_CLAIM_CHARS`` (read from a bounded window, so long texts cost no more)."""
    window = text[:_CLAIM_WINDOW]
    return _squash(_BRACKET.sub(lambda m: m[0] if _is_editorial(m[1]) else "", window))[
        :MAX_CLAIM_CHARS
    ]


def _markers(text: str, base: int, before: Callable[[], str]) -> list[tuple[int, str, str]]:
    """The bracket markers of one block as (position, keys, claim), each attached to its
    sentence: the one it stands in, or, when it opens a sentence (nothing but markers
    and space before it there) the previous one. A block of markers alone cites
    ``before()``: the last sentence of the last earlier block with words ("" for none)."""
    found = []
    if not _has_words(text):
        claim = before()
        return [
            (base + m.start(), m[1], claim)
            for m in _BRACKET.finditer(text)
            if not _is_editorial(m[1])
        ]
    ends = _sentence_ends(text)
    starts = [0, *ends[:-1]]
    claims: dict[int, str] = {}
    leads: dict[int, int] = {}  # where each sentence's own words begin
    for match in _BRACKET.finditer(text):
        if _is_editorial(match[1]):
            continue
        index = min(bisect.bisect_right(ends, match.start()), len(ends) - 1)
        if index not in leads:
            leads[index] = _LEADING_MARKERS.match(text, starts[index]).end()
        if match.start() < leads[index] and index > 0:
            index -= 1
        if index not in claims:
            claims[index] = _claim(text[starts[index] : ends[index]])
        found.append((base + match.start(), match[1], claims[index]))
    return found


def _has_words(block: str) -> bool:
    """Whether ``block`` holds more than markers, space and punctuation."""
    return any(ch.isalnum() for ch in _BRACKET.sub("", block))


def _last_sentence(block: str) -> str:
    """The claim of ``block``'s last sentence that holds words ("" for none)."""
    ends = _sentence_ends(block)
    for start, end in zip([0, *ends[:-1]][::-1], ends[::-1], strict=True):
        if _has_words(block[start:end]):
            return _claim(block[start:end])
    return ""


def _squash(text: str) -> str:
    return _SPACE_BEFORE_PUNCT.sub(r"\1", " ".join(text.split()))


def extract_citations(doc_html: str) -> list[Citation]:
    """The document's citations in document order (pure; the same input gives the same
    markers), by the rules in the module docstring."""
    body = LexborHTMLParser(doc_html).body
    if body is None:
        return []
    text, cited = _walk(body)
    found: list[tuple[int, str, str]] = [
        (start, keys, _claim(text[start : min(end, start + _CLAIM_WINDOW)].replace(_BREAK, " ")))
        for start, end, keys in cited
    ]
    offset = 0
    # The last sentence of the last block with words, for a block of markers alone:
    # computed once per such block, however many blocks of markers follow it.
    before: Callable[[], str] = str
    for block in text.split(_BREAK):
        if "[" in block:
            found.extend(_markers(block, offset, before))
        if _has_words(block):
            before = cache(partial(_last_sentence, block))
        offset += len(block) + 1
    found.sort(key=lambda item: item[0])  # stable: an element before a marker at its start
    citations = []
    for _, keys, claim in found:
        for key in re.split(r"\s*[,;]\s*", keys.strip()):
            if key:
                citations.append(
                    Citation(marker=f"c{len(citations) + 1}", source_key=key[:64], claim=claim)
                )
    return citations


def _key_count(keys: str) -> int:
    return sum(1 for key in _KEY_SEPARATOR.split(keys.strip()) if key)


_KEY_SEPARATOR = re.compile(r"\s*[,;]\s*")


def count_citations(doc_html: str) -> int:
    """``len(extract_citations(doc_html))`` without building a claim: what admission needs
    (none, or too many, is refused at the click) at a fraction of the cost. The document
    is laid out as :func:`extract_citations` lays it out; each ``data-source`` element and
    each bracket marker counts its keys, editorial markers (``[sic]``) none."""
    body = LexborHTMLParser(doc_html).body
    if body is None:
        return 0
    text, cited = _walk(body)
    count = sum(_key_count(keys) for _, _, keys in cited)
    if "[" in text:
        count += sum(
            _key_count(match[1]) for match in _BRACKET.finditer(text) if not _is_editorial(match[1])
        )
    return count


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
        str(s["key"]).casefold(): Source(
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
        judgement = judge.judge(
            claim=citation.claim, source=by_key.get(citation.source_key.casefold())
        )
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
