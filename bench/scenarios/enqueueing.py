"""Enqueue with an EXCLUSIVE key, against procrastinate's ``defer(queueing_lock=…)``.

One thread enqueues N jobs in a loop, each with a new key (nothing is deduplicated):
pgstage's ``queueing.enqueue(policy=EXCLUSIVE)`` against procrastinate's
``task.configure(queueing_lock=…).defer()``, both on Django's connection. Timed from the
first call to the last return; in autocommit, and with each call in its own
``transaction.atomic()`` block.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from bench import database
from bench.harness import Row, Target, alternate, say, timed
from bench.scenarios.common import Context, through
from bench.tasks import NOOP, STAGE_KEY, noop
from bench.wire import WireCounter
from queueing.enqueue import Policy, enqueue

QUEUE = "bench_enqueue"
WARM_UP = 50
COUNTED = 5
SPLIT_CALLS = 200


def _pgstage(tag: str, i: int) -> None:
    enqueue(
        NOOP,
        args={"unit": i},
        queue=QUEUE,
        key=STAGE_KEY.build(hop="enqueue", unit=f"{tag}-{i}"),
        policy=Policy.EXCLUSIVE,
    )


def _plain(tag: str, i: int) -> None:
    noop.configure(queue=QUEUE, queueing_lock=f"bench:enqueue:{tag}-{i}").defer(unit=i)


def _calls(side: Callable[[str, int], None], count: int, *, atomic: bool) -> None:
    tag = uuid.uuid4().hex[:8]
    for i in range(count):
        if atomic:
            with transaction.atomic():
                side(tag, i)
        else:
            side(tag, i)


def _rate(side: Callable[[str, int], None], count: int, *, atomic: bool) -> float:
    seconds = timed(lambda: _calls(side, count, atomic=atomic))
    database.delete_bench_jobs()
    return count / seconds


def _split(side: Callable[[str, int], None], *, atomic: bool) -> dict[str, float]:
    """Per call: the whole call and its statements as Django timed them (client to
    server and back); the difference is spent in Python."""
    with CaptureQueriesContext(connection) as captured:
        seconds = timed(lambda: _calls(side, SPLIT_CALLS, atomic=atomic))
    database.delete_bench_jobs()
    statements = sum(float(q["time"]) for q in captured.captured_queries)
    return {
        "call_us": seconds / SPLIT_CALLS * 1e6,
        "statements_us": statements / SPLIT_CALLS * 1e6,
    }


def _round_trips(ctx: Context, *, atomic: bool) -> dict[str, object]:
    profile = {}
    with WireCounter(ctx.params) as counter:
        for name, side in (("pgstage", _pgstage), ("baseline", _plain)):

            def counted(side=side) -> dict[str, object]:
                before = counter.snapshot()
                _calls(side, COUNTED, atomic=atomic)
                return (counter.snapshot() - before).per(COUNTED, top=4)

            profile[name] = through(counter, counted)
    database.delete_bench_jobs()
    return profile


def run(ctx: Context) -> list[Row]:
    n = ctx.sizes.enqueues
    rows = []
    for atomic in (False, True):
        where = "inside atomic()" if atomic else "autocommit"
        say(f"enqueue, {where}")
        _rate(_plain, WARM_UP, atomic=atomic)
        _rate(_pgstage, WARM_UP, atomic=atomic)
        measured, baseline = alternate(
            ctx.sizes.repetitions,
            lambda _r, atomic=atomic: _rate(_plain, n, atomic=atomic),
            lambda _r, atomic=atomic: _rate(_pgstage, n, atomic=atomic),
        )
        row = Row(
            key=f"enqueue_exclusive_{'atomic' if atomic else 'autocommit'}",
            scenario=f"enqueue, EXCLUSIVE key, {where}",
            unit="enqueues/s",
            measures=(
                f"{n:,} enqueues in a loop in one thread, each with a new key, "
                + ("each in its own transaction.atomic(); " if atomic else "in autocommit; ")
                + "from the first call to the last return"
            ),
            parameters={"enqueues": n, "atomic": atomic, "warm_up": WARM_UP},
            result=measured,
            baseline_label="defer(queueing_lock=…)",
            baseline=baseline,
            target=Target(on="ratio", op=">=", value=0.95),
            profile={
                "counts": _round_trips(ctx, atomic=atomic),
                "time_per_call": {
                    "pgstage": _split(_pgstage, atomic=atomic),
                    "baseline": _split(_plain, atomic=atomic),
                },
            },
        )
        row.cause = _cause(row)
        rows.append(row)
    return rows


def _cause(row: Row) -> str:
    if row.met is not False:
        return ""
    counts = row.profile["counts"]
    ours, theirs = counts["pgstage"]["round_trips"], counts["baseline"]["round_trips"]
    extra_us = (1 / row.figure - 1 / row.baseline.median) * 1e6
    split = row.profile["time_per_call"]
    parts = "; ".join(
        f"{name}: {t['call_us']:.0f} µs per call, of which {t['statements_us']:.0f} µs in "
        "its statements (as Django times them)"
        for name, t in (("pgstage", split["pgstage"]), ("defer", split["baseline"]))
    )
    overlap = (
        " The two sides' min-max ranges overlap: the gap is within this run's noise."
        if row.result.high >= row.baseline.low
        else ""
    )
    return (
        f"{ours:g} round trip(s) per enqueue against {theirs:g}; pgstage spends "
        f"{extra_us:.0f} µs more per call ({parts}).{overlap}"
    )
