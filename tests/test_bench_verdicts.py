"""The bench's verdicts: the sustained-load scenario's latency target
(``bench.scenarios.sustained``), only where the figures' bounds allow one (a percentile
reached by jobs not started by the horizon is a lower bound of the true one:
``p50_exact``/``p99_exact`` false); the admission's CPU floor."""

from __future__ import annotations

import pytest

from bench.harness import Target
from bench.scenarios.sustained import _latency_target

TARGET = Target(on="ratio", op="<=", value=1.2)


def figures(ms: float, exact: bool) -> dict[str, object]:
    return {"p99_ms": ms, "p99_exact": exact}


@pytest.mark.parametrize(
    ("mine", "theirs", "verdict"),
    [
        # Both exact: the ratio is the true one, met or not.
        (figures(100, True), figures(100, True), TARGET),
        (figures(500, True), figures(100, True), TARGET),
        # pgstage exact, plain's a lower bound: plain's true figure is larger, so the true
        # ratio is smaller than the one shown. Within the target: met for sure.
        (figures(100, True), figures(200, False), TARGET),
        # ... over it: the true ratio may still be within: no verdict.
        (figures(500, True), figures(100, False), None),
        # pgstage's a lower bound, plain exact: the true ratio is larger than shown. Over
        # the target: missed for sure; within it: no verdict.
        (figures(500, False), figures(100, True), TARGET),
        (figures(100, False), figures(100, True), None),
        # Both lower bounds: nothing follows either way.
        (figures(100, False), figures(100, False), None),
        (figures(500, False), figures(100, False), None),
    ],
)
def test_a_latency_target_only_where_the_bounds_allow_a_verdict(mine, theirs, verdict):
    assert _latency_target(mine, theirs, 99) == verdict


def test_figures_without_the_exactness_flag_count_as_exact():
    # Rows of runs before the flag existed (and the smoke run's tiny windows).
    assert _latency_target({"p50_ms": 9.0}, {"p50_ms": 1.0}, 50) == TARGET


def test_a_plain_figure_of_zero_is_an_infinite_ratio():
    assert _latency_target(figures(5, False), figures(0, True), 99) == TARGET
    assert _latency_target(figures(5, True), figures(0, False), 99) is None


def test_the_admission_cpu_floor_says_whether_the_target_is_within_the_cpus_reach(monkeypatch):
    """The admission's CPU ceiling (every CPU busy, no wait) against the rate the target
    needs: below it, the page says the target is out of reach on that machine."""
    from bench.scenarios import admission

    monkeypatch.setattr(admission.os, "cpu_count", lambda: 2)
    floor = {"admit_cpu": 0.5, "server_cpu": 0.75, "defer_cpu": 0.25, "defer_server_cpu": 0.25}
    # 2 CPUs / 1.25 ms = 1,600 admits/s at most.
    assert "out of reach here" in admission._cpu_floor(floor, needed=1700)
    assert "at most about 1,600/s" in admission._cpu_floor(floor, needed=1700)
    assert "within what the CPU allows" in admission._cpu_floor(floor, needed=1500)
    assert admission._cpu_floor({"admit_cpu": 0.5, "defer_cpu": 0.25}, needed=1) == ""


def test_the_storm_cause_splits_the_serialisation_from_the_admits_own_work(monkeypatch):
    """The storm's page text: the baseline's defers serialised under one lock (measured
    in the same run) against the plain storm, and what the admit adds on top of them."""
    from bench.harness import Row, series
    from bench.scenarios import admission

    monkeypatch.setattr(admission.os, "cpu_count", lambda: 2)
    floor = {
        "admit": 1.3, "client": 0.56, "admit_cpu": 0.5, "wire": 0.08, "server": 0.67,
        "statement": 0.2, "planning": 1.4, "prepared": 1.0, "defer": 0.68,
        "under_lock": 0.67, "commit": 0.47,
        "server_cpu": 0.75, "defer_cpu": 0.25, "defer_server_cpu": 0.25,
    }  # fmt: skip
    row = Row(
        key="admit_storm_p99",
        scenario="storm",
        unit="ms",
        measures="",
        parameters={"threads": 50},
        result=series([100.0]),
        baseline=series([60.0]),
        profile={"serialised_defers_p99_ms": 75.0},
    )
    text = admission._storm_floor(floor, row)
    assert "take 75 ms at p99 in this run, 1.25x the plain storm" in text
    assert "the admit's own work makes the rest (25 ms)" in text
    # 1.25 ms of CPU an admit, 0.5 a defer: 50 x 0.75 ms more.
    assert "1.25 ms of CPU an admit against 0.50 ms a defer" in text
    assert "38 ms more in a storm, on 2 CPU(s)" in text
    # A row of a run without the serialised storm says nothing of it.
    row.profile.clear()
    assert "serialising" not in admission._storm_floor(floor, row)
