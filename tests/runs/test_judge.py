"""Citation extraction and the default offline judge (pure functions, no database)."""

from __future__ import annotations

import pytest

from runs.exceptions import JudgeError
from runs.judge import OverlapJudge, Source, extract_citations, judge_document, summarize
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
