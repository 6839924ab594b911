"""How fast the machine is, at the start of a run and at its end: three fixed probes,
printed beside the figures so a reader can tell a slow or busy host from a slow build.

Ratios carry across machines; absolute figures (a sweep's milliseconds, a rate) belong to
the machine they were measured on. The probes are what those figures are made of:

* ``cpu_loop_ms``: a fixed loop of Python (sum of squares to 200,000), median of 7 — the
  harness's and the workers' own speed;
* ``round_trip_ms``: ``SELECT 1`` on the harness's connection, median of 50 — the wire
  and the server's idle response;
* ``commit_ms``: a one-row INSERT committed with ``synchronous_commit`` on, median of 50
  — the write-ahead log's flush, which every job's start, claim and completion wait for.

A probe that moved by more than a quarter between the start and the end says the machine
changed under the run (another load, a throttled disk): its figures are suspect.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

__all__ = ["DRIFT", "drift", "probe", "text"]

#: A probe that moved by more than this share between start and end flags the run.
DRIFT = 0.25


def _median_ms(func: Any, times: int) -> float:
    func()  # warm: the first call pays for caches and a CPU coming out of idle
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        func()
        samples.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(samples), 3)


def _loop() -> None:
    total = 0
    for i in range(200_000):
        total += i * i


def probe() -> dict[str, float]:
    """The three probes, on Django's default connection (autocommit)."""
    from django.db import connection

    with connection.cursor() as cursor:

        def select_one() -> None:
            cursor.execute("SELECT 1")
            cursor.fetchone()

        def commit() -> None:
            # A temporary or unlogged table writes no WAL: a real one, dropped after.
            cursor.execute("INSERT INTO bench_speed_commit_probe (n) VALUES (1)")

        cursor.execute("CREATE TABLE IF NOT EXISTS bench_speed_commit_probe (n int)")
        try:
            cursor.execute("SET synchronous_commit = on")
            figures = {
                "cpu_loop_ms": _median_ms(_loop, 7),
                "round_trip_ms": _median_ms(select_one, 50),
                "commit_ms": _median_ms(commit, 50),
            }
        finally:
            cursor.execute("RESET synchronous_commit")
            cursor.execute("DROP TABLE IF EXISTS bench_speed_commit_probe")
    return figures


def drift(start: dict[str, float], end: dict[str, float]) -> dict[str, float]:
    """Per probe, end ÷ start, for the probes that moved by more than :data:`DRIFT`."""
    moved = {}
    for name, before in start.items():
        after = end.get(name)
        if after is None or before <= 0:
            continue
        ratio = after / before
        if abs(ratio - 1) > DRIFT:
            moved[name] = round(ratio, 2)
    return moved


_LABELS = {
    "cpu_loop_ms": "a fixed Python loop",
    "round_trip_ms": "a bare round trip",
    "commit_ms": "a flushed one-row commit",
}


def text(speed: dict[str, Any]) -> str:
    """One sentence for the page: the probes at the start and the end, and any drift."""
    start, end = speed.get("start") or {}, speed.get("end") or {}
    parts = []
    for name, label in _LABELS.items():
        if name in start:
            after = f" → {end[name]:.3f}" if name in end else ""
            parts.append(f"{label} {start[name]:.3f}{after} ms")
    sentence = "Host speed at the start → the end of the run (bench/speed.py): " + (
        "; ".join(parts) + "."
    )
    moved = drift(start, end) if end else {}
    if moved:
        sentence += (
            " **The machine changed during the run** ("
            + ", ".join(f"{_LABELS[n]} {r}x" for n, r in moved.items())
            + "): its absolute figures are suspect."
        )
    return sentence
