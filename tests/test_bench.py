"""The benchmark harness runs end to end: ``python -m bench --smoke`` (tiny sizes, one
repetition) against the test database, real workers included, and writes valid JSON and
its Markdown page. Nothing here looks at a time or a ratio: the harness measures, it is
not a test of speed."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: A row per scenario of the table, and the scaling and round-trip rows.
EXPECTED = {
    "enqueue_exclusive_autocommit",
    "enqueue_exclusive_atomic",
    "admit_throughput",
    "admit_throughput_single",
    "admit_scaling",
    "admit_storm_p99",
    "admit_long_ledger",
    "admit_round_trips_free",
    "admit_round_trips_queued",
    "resume_sweep_idle",
    "stage_jobs_c1",
    "stage_jobs_c4",
    "stage_jobs_c1_bare",
    "stage_jobs_p2",
    "worker_peak_rss",
    "inquiries_throughput",
    "inquiry_latency_p50",
    "stage_round_trips",
    "inquiry_round_trips",
    "unsaved_sweep_small",
    "unsaved_sweep_large",
    "unsaved_sweep_growth",
    "metrics_scrape",
    "sustained_20_served",
    "sustained_20_claim_p50",
    "sustained_20_claim_p99",
}
KEYS = {"scenario", "parameters", "figure", "unit", "baseline", "ratio", "target", "met"}


@pytest.mark.timeout(900)
def test_smoke_run_writes_every_scenario(clean_queue, tmp_path):
    results, page = tmp_path / "smoke.json", tmp_path / "benchmarks.md"
    env = {**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(results), "--doc", str(page)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-5000:]

    document = json.loads(results.read_text())
    rows = {row["key"]: row for row in document["scenarios"]}
    assert set(rows) >= EXPECTED, sorted(EXPECTED - set(rows))
    for key, row in rows.items():
        assert set(row) >= KEYS, key
        assert row["error"] is None, (key, row["error"])
        assert isinstance(row["figure"], int | float) and math.isfinite(row["figure"]), key
        assert {"median", "min", "max", "samples"} <= set(row), key
        if row["baseline"] is not None:
            assert isinstance(row["baseline"]["figure"], int | float), key
        if row["target"] is not None:
            assert isinstance(row["met"], bool), key
    assert document["git"]["commit"]
    assert document["machine"]["cpus"]
    speed = document["machine"]["speed"]
    for moment in ("start", "end"):
        assert set(speed[moment]) == {"cpu_loop_ms", "round_trip_ms", "commit_ms"}, moment
        assert all(0 < v < 10_000 for v in speed[moment].values()), speed
    assert document["sizes"]["mode"] == "smoke"

    text = page.read_text()
    assert "| scenario | today |" in text
    assert "Host speed at the start → the end of the run" in text
    for row in rows.values():
        assert row["scenario"].replace("|", "\\|") in text


def test_a_database_that_does_not_exist_is_named_with_what_to_do(tmp_path):
    """``DATABASE_URL`` naming a database that is not there: one line saying which and
    what to do, exit status 2, no traceback."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(database_url())
    missing = urlunsplit(parts._replace(path="/pgstage_bench_not_created"))
    run = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--json", str(tmp_path / "r.json"), "--no-doc"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": missing},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr[-2000:]
    assert "createdb pgstage_bench_not_created" in run.stderr
    assert "Traceback" not in run.stderr
    assert not (tmp_path / "r.json").exists()


def test_the_speed_sentence_flags_a_probe_that_moved_by_more_than_a_quarter():
    from bench import speed

    start = {"cpu_loop_ms": 10.0, "round_trip_ms": 0.1, "commit_ms": 0.5}
    steady = speed.text({"start": start, "end": {**start, "commit_ms": 0.6}})
    assert "a flushed one-row commit 0.500 → 0.600 ms" in steady
    assert "changed during the run" not in steady
    moved = speed.text({"start": start, "end": {**start, "cpu_loop_ms": 14.0}})
    assert "The machine changed during the run** (a fixed Python loop 1.4x)" in moved
