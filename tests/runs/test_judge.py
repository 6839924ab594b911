"""Citation extraction and the default offline judge (pure functions, no database).

``CASES`` is the definition of sentence and marker attachment, as a table: HTML in (as
browsers parse it, HTML5 optional end tags and all), citations and verdicts out. A shape
that was ever judged wrong gets a row.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runs.exceptions import JudgeError
from runs.judge import (
    MAX_CLAIM_CHARS,
    OverlapJudge,
    Source,
    count_citations,
    extract_citations,
    judge_document,
    summarize,
)
from runs.models import Verdict
from tests.runs.factories import DOC_HTML, SOURCES


def test_extracts_bracket_markers_and_data_source_elements_in_document_order():
    citations = extract_citations(DOC_HTML)

    assert [(c.marker, c.source_key) for c in citations] == [
        ("c1", "thermo"),
        ("c2", "moon"),
        ("c3", "thermo"),
    ]
    assert citations[0].claim == "Water boils at one hundred degrees at sea level."
    assert citations[2].claim == "The boiling point depends on air pressure"


def test_a_marker_with_several_keys_cites_each_source_for_the_same_claim():
    citations = extract_citations("<p>Tides follow the moon [moon, ocean; sun].</p>")

    assert [c.source_key for c in citations] == ["moon", "ocean", "sun"]
    assert {c.claim for c in citations} == {"Tides follow the moon."}


def test_nested_markup_inside_a_cited_element_is_part_of_its_claim():
    citations = extract_citations('<p><span data-source="k">Deep <b>nested</b> text</span></p>')

    assert [(c.source_key, c.claim) for c in citations] == [("k", "Deep nested text")]


def test_a_document_without_citations_yields_none():
    assert extract_citations("<p>No citations at all, not even [ this ].</p>") == []


def test_overlap_judge_grades_by_share_of_claim_words_in_the_source():
    judge = OverlapJudge()
    source = Source(key="s", text="Water boils at one hundred degrees at sea level.")

    assert judge.judge(claim="Water boils at sea level", source=source).verdict == (
        Verdict.SUPPORTED
    )
    assert judge.judge(claim="Water freezes in winter at sea", source=source).verdict == (
        Verdict.PARTIAL
    )
    assert judge.judge(claim="Cats purr loudly", source=source).verdict == Verdict.UNSUPPORTED
    assert judge.judge(claim="Anything", source=None).verdict == Verdict.MISSING_SOURCE


def test_judge_document_is_deterministic_and_names_missing_sources():
    first = judge_document(doc_html=DOC_HTML + "<p>Unknown claim [ghost].</p>", sources=SOURCES)
    second = judge_document(doc_html=DOC_HTML + "<p>Unknown claim [ghost].</p>", sources=SOURCES)

    assert first == second
    assert first[-1].verdict == Verdict.MISSING_SOURCE
    assert summarize([v.as_json() for v in first])["citations"] == 4


def test_judge_document_refuses_a_document_without_citations():
    with pytest.raises(JudgeError):
        judge_document(doc_html="<p>nothing</p>", sources=SOURCES)


def test_judge_is_pluggable_through_settings(settings):
    settings.RUNS_JUDGE = "tests.runs.test_judge.AlwaysSupported"

    verdicts = judge_document(doc_html=DOC_HTML, sources=SOURCES)

    assert {v.verdict for v in verdicts} == {Verdict.SUPPORTED}


class AlwaysSupported:
    name = "always"

    def judge(self, *, claim, source):
        from runs.judge import Judgement

        return Judgement(verdict=Verdict.SUPPORTED, score=1.0)


TABLE_SOURCES = [
    {"key": "s1", "title": "Optics", "text": "Rayleigh scattering makes the sky blue."},
    {"key": "s2", "title": "Botany", "text": "Chlorophyll makes grass green."},
]
SKY = "Rayleigh scattering makes the sky blue"
GRASS = "Chlorophyll makes grass green"
OK, NO, MISSING = Verdict.SUPPORTED, Verdict.UNSUPPORTED, Verdict.MISSING_SOURCE

#: id → (HTML in, [(source key, claim, verdict)] out, in document order).
CASES = {
    "a marker after the period cites the sentence before it": (
        "<p>The sky is blue because of Rayleigh scattering. [s1] Grass is green because of "
        "chlorophyll [s2].</p>",
        [
            ("s1", "The sky is blue because of Rayleigh scattering.", OK),
            ("s2", "Grass is green because of chlorophyll.", OK),
        ],
    ),
    "a marker right after the period cites the sentence before it": (
        f"<p>{SKY}.[s1] {GRASS}.[s2]</p>",
        [("s1", f"{SKY}.", OK), ("s2", f"{GRASS}.", OK)],
    ),
    "a superscript marker after the period cites the sentence before it": (
        f"<p>{SKY}.<sup>[s1]</sup> {GRASS}.<sup><a href=#s2>[s2]</a></sup></p>",
        [("s1", f"{SKY}.", OK), ("s2", f"{GRASS}.", OK)],
    ),
    "a marker between a period and a lower-case word ends no sentence": (
        "<p>Rayleigh scattering makes the sky blue at 12 p.m.[s1] and the grass green.</p>",
        [("s1", "Rayleigh scattering makes the sky blue at 12 p.m. and the grass green.", OK)],
    ),
    "a marker before the period cites its sentence": (
        f"<p>{SKY} [s1]. {GRASS} [s2].</p>",
        [("s1", f"{SKY}.", OK), ("s2", f"{GRASS}.", OK)],
    ),
    "a marker opening a block cites the sentence after it": (
        f"<p>[s1] {SKY}.</p>",
        [("s1", f"{SKY}.", OK)],
    ),
    "list items without end tags are two citations": (
        f"<ul><li data-source=s1>{SKY}<li data-source=s2>{GRASS}</ul>",
        [("s1", SKY, OK), ("s2", GRASS, OK)],
    ),
    "paragraphs without end tags are two blocks": (
        f"<p>{SKY} [s1]<p>{GRASS} [s2]",
        [("s1", SKY, OK), ("s2", GRASS, OK)],
    ),
    "a nested data-source is a citation of its own": (
        f"<div data-source=s1>{SKY}; <span data-source=s2>{GRASS.lower()}</span></div>",
        [("s1", f"{SKY}; {GRASS.lower()}", OK), ("s2", GRASS.lower(), OK)],
    ),
    "a duplicate attribute keeps the first value, as browsers do": (
        f"<p data-source=s1 data-source=s2>{SKY}</p>",
        [("s1", SKY, OK)],
    ),
    "[sic] is an editorial note, not a citation": (
        "<p>The sky is blew [sic] blue by Rayleigh scattering [s1].</p>",
        [("s1", "The sky is blew [sic] blue by Rayleigh scattering.", OK)],
    ),
    "e.g. does not end a sentence": (
        "<p>Pigments, e.g. Chlorophyll, make grass green [s2].</p>",
        [("s2", "Pigments, e.g. Chlorophyll, make grass green.", OK)],
    ),
    "an abbreviation of initials does not end a sentence": (
        f"<p>{GRASS}. U.S. Rayleigh scattering makes the sky blue [s1].</p>",
        [("s1", "U.S. Rayleigh scattering makes the sky blue.", OK)],
    ),
    "an ellipsis ends a sentence": (
        f"<p>{SKY}\u2026[s1] {GRASS} [s2]. {SKY}\u2026 and more [s1].</p>",
        [
            ("s1", f"{SKY}\u2026", OK),
            ("s2", f"{GRASS}.", OK),
            ("s1", f"{SKY}\u2026 and more.", OK),
        ],
    ),
    "a title abbreviation does not end a sentence": (
        "<p>Dr. Rayleigh showed why the sky is blue [s1].</p>",
        [("s1", "Dr. Rayleigh showed why the sky is blue.", OK)],
    ),
    "a question ends a sentence": (
        "<p>Why is the sky blue? Rayleigh scattering [s1].</p>",
        [("s1", "Rayleigh scattering.", OK)],
    ),
    "a marker after a closing quote cites the quoted sentence": (
        f'<p>He wrote: "{SKY}." [s1] Then he left.</p>',
        [("s1", f'He wrote: "{SKY}."', OK)],
    ),
    "scripts and comments are no text": (
        f'<p>{SKY} [s1].<!-- [s2] --></p><script>var x = "[s2]";</script>',
        [("s1", f"{SKY}.", OK)],
    ),
    "a marker inside a cited element cites that element's sentence too": (
        f"<li data-source=s1>{SKY} [s2]</li>",
        [("s1", SKY, OK), ("s2", SKY, NO)],
    ),
    "several keys cite the same claim, a missing one is named": (
        "<p>Grass is green by chlorophyll [s2, ghost].</p>",
        [
            ("s2", "Grass is green by chlorophyll.", OK),
            ("ghost", "Grass is green by chlorophyll.", MISSING),
        ],
    ),
    "a marker alone between paragraphs cites the last sentence before it": (
        f"<p>Intro. {SKY}.</p><p>[s1]</p><p>{GRASS}.</p>",
        [("s1", f"{SKY}.", OK)],
    ),
    "a marker alone between blocks, outside any element, cites the sentence before it": (
        f"<p>{SKY}.</p> <sup>[s1]</sup> <p>{GRASS} [s2].</p>",
        [("s1", f"{SKY}.", OK), ("s2", f"{GRASS}.", OK)],
    ),
    "a lone marker skips blank blocks back to the last sentence": (
        f"<ul><li>{GRASS}</ul><p> </p><br><p>[s2] [s1]</p>",
        [("s2", GRASS, OK), ("s1", GRASS, NO)],
    ),
    "a lone marker with no sentence before it is unattached: an empty claim": (
        f"<p>[s1]</p><p>{GRASS}.</p>",
        [("s1", "", NO)],
    ),
    "a key matches its source in any case": (
        f'<p>{SKY} [S1].</p><p data-source="S2">{GRASS}</p>',
        [("S1", f"{SKY}.", OK), ("S2", GRASS, OK)],
    ),
    "a void element cites nothing": (
        f'<p>{GRASS} [s2]<img data-source=s1 alt="sky"></p>',
        [("s2", GRASS, OK)],
    ),
}


@pytest.mark.parametrize(("html", "expected"), CASES.values(), ids=CASES.keys())
def test_citations_and_verdicts_table(html, expected):
    verdicts = judge_document(doc_html=html, sources=TABLE_SOURCES, judge=OverlapJudge())

    assert [(v.source_key, v.claim, v.verdict) for v in verdicts] == expected
    assert [v.marker for v in verdicts] == [f"c{i}" for i in range(1, len(expected) + 1)]


@pytest.mark.parametrize(
    "html",
    [
        "<p>" + "[s1]" * 50_000 + "</p>",
        "<p>" + "x. " * 100_000 + "[s1]</p>",
        "<p>" + " " * 300_000 + "[s1].</p>",
        "<span data-source=s1>" * 5_000 + "x" * 1_000,
        "<p>" + "e.g. " * 100_000 + "[s1]</p>",
        "<p>" + "x. " * 100_000 + "</p>" + "<p>[s1]</p>" * 1_000,
    ],
    ids=["markers", "sentences", "spaces", "nesting", "abbreviations", "lone markers"],
)
def test_adversarial_documents_are_extracted_whole(html):
    """No quadratic step and no recursion limit: each finishes, with every citation
    (how fast is for bench/, this only shows nothing gives up)."""
    citations = extract_citations(html)

    assert citations and all(len(c.claim) <= MAX_CLAIM_CHARS for c in citations)


_FRAGMENTS = st.sampled_from(
    [
        "Water boils. ",
        "e.g. this ",
        "[s1]",
        "[s1, s2]",
        "[s1;s2 ; s3]",
        "[sic]",
        "[SIC]",
        "[ s1]",
        "[]",
        "[bad key]",
        "[a" + "b" * 70 + "]",
        "[",
        "]",
        "<p>",
        "</p>",
        "<br>",
        "<li>",
        "<div>",
        "</div>",
        '<span data-source="s1">',
        '<span data-source="s1, s2">',
        '<span data-source=" ">',
        '<span data-source="sic">',
        "</span>",
        '<img data-source="s1">',
        "<script>[s9]</script>",
        "<style>p{}</style>",
        "<!-- [s8] -->",
        "<textarea>[s7]</textarea>",
        "\u00a0",
        "\x00",
        "&#91;s5&#93;",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_FRAGMENTS, max_size=30).map("".join))
def test_the_admissions_count_is_the_number_of_citations_extracted(html):
    """Admission refuses by count_citations (none, or too many); the analysis judges what
    extract_citations finds: on any document they agree."""
    assert count_citations(html) == len(extract_citations(html))


@pytest.mark.parametrize(("html", "expected"), CASES.values(), ids=CASES.keys())
def test_the_count_agrees_on_every_table_document(html, expected):
    assert count_citations(html) == len(extract_citations(html)) == len(expected)
