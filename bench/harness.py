"""The harness's vocabulary: sizes per mode, repeated samples, targets, rows of the table.

A scenario measures pgstage and, where the table names one, its baseline (plain
procrastinate doing nothing but what the scenario needs of both sides). Both sides run in
the same process, alternately — plain, pgstage, plain, pgstage, … — so a machine that
gets busier or quieter during the run moves both; each side's figure is the median of its
repetitions, reported with their min-max. Nothing here asserts a time.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal


@dataclass(frozen=True, kw_only=True)
class Sizes:
    """How much each scenario does; ``full`` is what ``make bench`` runs."""

    mode: str
    repetitions: int
    admits: int
    admit_users: int
    admit_threads: int
    storm: int
    storms: int
    counted_admits: int
    #: Ledger entries of the user whose admits are timed against a fresh user's.
    ledger_entries: int
    sweep_small: int
    sweep_large: int
    sweep_calls: int
    resume_users: int
    stage_jobs: int
    worker_processes: tuple[int, ...]
    inquiries: int
    latency_samples: int
    enqueues: int
    counted_jobs: int
    counted_inquiries: int
    #: Offered rates (jobs/s) of the sustained-load scenario, each held this long.
    sustained_rates: tuple[int, ...]
    sustained_seconds: float
    sustained_concurrency: int


FULL = Sizes(
    mode="full",
    repetitions=5,
    admits=800,
    admit_users=100,
    admit_threads=8,
    storm=50,
    storms=3,
    counted_admits=5,
    ledger_entries=100_000,
    sweep_small=10_000,
    sweep_large=1_000_000,
    sweep_calls=5,
    resume_users=100,
    stage_jobs=1000,
    worker_processes=(1, 2, 4),
    inquiries=50,
    latency_samples=15,
    enqueues=2000,
    counted_jobs=200,
    counted_inquiries=20,
    # 200, 400 and 600 jobs/s are the rates asked of both; 100 is one a 2-core machine
    # serves on either side, so claim latencies compare where neither falls behind.
    sustained_rates=(100, 200, 400, 600),
    sustained_seconds=60,
    sustained_concurrency=4,
)
QUICK = replace(
    FULL,
    mode="quick",
    repetitions=2,
    admits=400,
    storms=2,
    counted_admits=3,
    sweep_large=100_000,
    sweep_calls=3,
    stage_jobs=400,
    inquiries=20,
    latency_samples=8,
    enqueues=1000,
    counted_jobs=100,
    counted_inquiries=10,
    sustained_seconds=10,
)
SMOKE = Sizes(
    mode="smoke",
    repetitions=1,
    admits=16,
    admit_users=4,
    admit_threads=2,
    storm=4,
    storms=1,
    counted_admits=1,
    ledger_entries=1000,
    sweep_small=200,
    sweep_large=1000,
    sweep_calls=1,
    resume_users=3,
    stage_jobs=12,
    worker_processes=(1, 2),
    inquiries=2,
    latency_samples=1,
    enqueues=20,
    counted_jobs=6,
    counted_inquiries=1,
    sustained_rates=(20,),
    sustained_seconds=2,
    sustained_concurrency=2,
)
MODES = {s.mode: s for s in (FULL, QUICK, SMOKE)}


@dataclass(frozen=True)
class Series:
    """The repetitions of one measurement (one sample per repetition)."""

    samples: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def low(self) -> float:
        return min(self.samples)

    @property
    def high(self) -> float:
        return max(self.samples)

    def as_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "samples": list(self.samples),
        }


def series(samples: Sequence[float]) -> Series:
    return Series(tuple(float(s) for s in samples))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0-100): a value that was measured."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, kw_only=True)
class Target:
    """What "met" means: ``figure`` or ``ratio`` (figure / baseline) against ``value``."""

    on: Literal["figure", "ratio"]
    op: Literal[">=", "<="]
    value: float

    def text(self, unit: str = "") -> str:
        sign = "≥" if self.op == ">=" else "≤"
        if self.on == "ratio":
            return f"ratio {sign} {self.value:g}"
        return f"{sign} {self.value:g}{'' if unit == 'x' else ' '}{unit}".rstrip()

    def met(self, *, figure: float | None, ratio: float | None) -> bool | None:
        value = ratio if self.on == "ratio" else figure
        if value is None:
            return None
        return value >= self.value if self.op == ">=" else value <= self.value

    def gap(self, *, figure: float | None, ratio: float | None) -> str:
        """How far a miss is from the target, in words."""
        value = ratio if self.on == "ratio" else figure
        if value is None or not value or not self.value:
            return ""
        factor = self.value / value if self.op == ">=" else value / self.value
        return f"{factor:.1f}x short of the target"


@dataclass(kw_only=True)
class Row:
    """One line of the table: pgstage's figure, its baseline, the target."""

    key: str
    scenario: str
    unit: str
    measures: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    result: Series | None = None
    baseline_label: str = ""
    baseline: Series | None = None
    target: Target | None = None
    #: Where the time goes, measured (round trips, statements, lock waits, plans).
    profile: dict[str, Any] = field(default_factory=dict)
    #: Why a target is not met, from the profile (written by the scenario).
    cause: str = ""
    error: str | None = None

    @property
    def figure(self) -> float | None:
        return self.result.median if self.result else None

    @property
    def ratio(self) -> float | None:
        if self.figure is None or self.baseline is None or not self.baseline.median:
            return None
        return self.figure / self.baseline.median

    @property
    def met(self) -> bool | None:
        if self.target is None or self.error:
            return None
        return self.target.met(figure=self.figure, ratio=self.ratio)

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenario": self.scenario,
            "parameters": dict(self.parameters),
            "figure": self.figure,
            "unit": self.unit,
            **(self.result.as_dict() if self.result else {"median": None}),
            "baseline": (
                {"label": self.baseline_label, "figure": self.baseline.median}
                | self.baseline.as_dict()
                if self.baseline
                else None
            ),
            "ratio": self.ratio,
            "target": (
                {"text": self.target.text(self.unit), "on": self.target.on}
                | {"op": self.target.op, "value": self.target.value}
                if self.target
                else None
            ),
            "met": self.met,
            "measures": self.measures,
            "profile": self.profile,
            "cause": self.cause,
            "error": self.error,
        }


def alternate(
    repetitions: int,
    plain: Callable[[int], float],
    pgstage: Callable[[int], float],
) -> tuple[Series, Series]:
    """Run the baseline and pgstage alternately, ``repetitions`` times each."""
    baseline, measured = [], []
    for repetition in range(repetitions):
        baseline.append(plain(repetition))
        measured.append(pgstage(repetition))
    return series(measured), series(baseline)


def timed(func: Callable[[], object]) -> float:
    """Seconds ``func`` took (monotonic clock)."""
    started = time.perf_counter()
    func()
    return time.perf_counter() - started


def say(message: str) -> None:
    """Progress, only for a person watching (a TTY): logs and CI stay quiet."""
    if sys.stderr.isatty():
        sys.stderr.write(f"\r\033[K{message}")
        sys.stderr.flush()


def said() -> None:
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K")
        sys.stderr.flush()
