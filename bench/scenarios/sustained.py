"""Sustained load: jobs offered at a steady rate for a while, pgstage against plain
procrastinate, on real worker processes (``bench.workers``).

For each offered rate (``Sizes.sustained_rates``, jobs/s) and each side in turn (plain
first), the harness enqueues jobs at that rate for ``Sizes.sustained_seconds``, in one
INSERT per 20 ms tick (the same for both sides, so the offering never limits the rate; the
enqueue scenarios measure enqueueing): pgstage's stage jobs (``bench.stage``: claim →
complete + enqueue the next hop, with their EXCLUSIVE key) against plain no-ops that defer
their next hop (``bench.noop_next``). One worker process per side, at concurrency
``Sizes.sustained_concurrency``. Then it waits until every offered job has ended, or for
at most :func:`drain_seconds` after the window (a side that falls behind is not waited
out: its backlog is what it left), and reads each job's deferral, first start and end
from procrastinate's events (database clock):

* claim latency: first start - deferral, per job; p50 and p99 over every job of the run.
  Both sides are cut off at the same horizon, :func:`drain_seconds` after their window's
  end (database clock): a job that had not started by then counts with the time it had
  waited until the horizon (a lower bound; ``unstarted`` in the profile counts them), so
  neither side's figures depend on how long the harness took to notice;
* served: jobs that started within the window ÷ its length;
* keeps up: every job offered in the window started within a second of the window's end
  (the backlog then is under a second's work), reported per side as ``backlog_s``; a side
  that left jobs unstarted reports them as ``unstarted``, and its ``backlog_s`` is at
  least the wait.

A side's window starts once the other side's worker has no statement running for more
than half a second (a fetch at work on the backlog the harness removed; the profile's
``settle_s``), and the profile reports the other side's CPU in the window
(``cpu.other_side``). Each side's jobs are deleted and the table vacuumed after it, so
the side measured second does not walk the first one's dead rows (the machine's server
runs without autovacuum).
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from bench import database
from bench.harness import Row, Target, percentile, say, series
from bench.scenarios.common import Context
from bench.scenarios.jobs import PLAIN_QUEUE, STAGE_QUEUE, _specs
from bench.tasks import NOOP_NEXT, STAGE, STAGE_KEY
from bench.workers import BenchError, WorkerGroup, cpu_reading, machine_cpu, running
from queueing.enqueue import Policy, queueing_lock_for

#: The offering loop's tick: each tick inserts the jobs due by then, in one statement.
TICK_SECONDS = 0.02
#: A side keeps up when its backlog at the window's end is at most this much.
KEEP_UP_SECONDS = 1.0
#: The longest wait after a window for its jobs to end (half the window, at least 5 s).
MAX_DRAIN_SECONDS = 30.0


def drain_seconds(window: float) -> float:
    """How long a side's jobs may take to end after its window of ``window`` seconds."""
    return min(MAX_DRAIN_SECONDS, max(5.0, window / 2))


def _jobs(*, tag: str, queue: str, task: str, keyed: bool) -> Callable[[int, int], None]:
    """Insert jobs ``first`` … ``first + count - 1`` of a run in one statement; a stage job
    carries its EXCLUSIVE key, as ``queueing.enqueue`` would give it."""

    def insert(first: int, count: int) -> None:
        units = [f"{tag}-{i}" for i in range(first, first + count)]
        locks = [
            queueing_lock_for(STAGE_KEY.build(hop="stage", unit=u), Policy.EXCLUSIVE)
            if keyed
            else None
            for u in units
        ]
        database.execute("sustained_insert", queue=queue, task=task, units=units, locks=locks)

    return insert


def _offer(
    rate: float, seconds: float, insert: Callable[[int, int], None]
) -> tuple[int, float, float]:
    """Enqueue ``rate`` jobs a second for ``seconds``; the jobs sent, the seconds the
    offering took (longer than ``seconds`` when the harness itself could not keep up) and
    its slowest insert's seconds."""
    started = time.monotonic()
    sent = 0
    slowest = 0.0

    def send(due: int) -> None:
        nonlocal sent, slowest
        before = time.monotonic()
        insert(sent, due)
        slowest = max(slowest, time.monotonic() - before)
        sent += due

    while (elapsed := time.monotonic() - started) < seconds:
        due = int(rate * elapsed) - sent
        if due <= 0:
            time.sleep(TICK_SECONDS)
            continue
        send(due)
    # An insert that took long left jobs of the schedule unsent: send them now, late (their
    # latency counts from when they were due), so both sides get the same jobs.
    if (due := int(rate * seconds) - sent) > 0:
        send(due)
    return sent, time.monotonic() - started, slowest


def _wait_ended(
    *,
    after: int,
    queue: str,
    task: str,
    sent: int,
    groups: list[WorkerGroup],
    timeout: float,
) -> list[tuple[Any, ...]]:
    """Each job's deferral, first start and end, once every one of the ``sent`` jobs has
    ended or ``timeout`` seconds have passed. The poll counts the jobs still open on the
    job table alone; the events are read once, at the end."""
    deadline = time.monotonic() + timeout
    while True:
        open_jobs = database.fetch_value("sustained_open", after=after, queue=queue, task=task)
        if database.fetch_value("job_broken", after=after):
            raise BenchError(f"a sustained-load job after {after} failed or was retried")
        for group in groups:
            group.check_alive()
        if not open_jobs or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if open_jobs:
        # A fetch that began before the deadline commits its start a moment later.
        time.sleep(1.0)
    database.execute("analyze_events")
    rows = database.fetch_all("sustained_jobs", after=after, queue=queue, task=task)
    if not open_jobs and len(rows) < sent:
        raise BenchError(f"{sent - len(rows)} sustained-load job(s) after {after} went missing")
    return rows


def _settle(group: WorkerGroup, *, timeout: float) -> float:
    """Wait until none of ``group``'s server sessions has been running a statement for
    more than half a second, for at most ``timeout`` seconds; the seconds waited."""
    started = time.monotonic()
    while database.fetch_value("group_busy", prefix=group.app_prefix + "%"):
        if time.monotonic() - started > timeout:
            break
        time.sleep(0.2)
    return time.monotonic() - started


def _discard(after: int) -> None:
    """Remove a side's jobs: the ones not running at once, the running ones (at most the
    worker's concurrency) once they end, with the next hops they defer; then vacuum, so
    the next side starts on a table without this one's dead rows."""
    database.execute("delete_batch", after=after)
    deadline = time.monotonic() + 60
    while database.fetch_value("doing_after", after=after) and time.monotonic() < deadline:
        time.sleep(0.2)
    database.discard_batch(after)


def _run_side(
    ctx: Context,
    groups: list[WorkerGroup],
    *,
    rate: int,
    queue: str,
    task: str,
    keyed: bool,
) -> dict[str, Any]:
    seconds = ctx.sizes.sustained_seconds
    after = database.last_job_id()
    side = "pgstage" if queue == STAGE_QUEUE else "plain"
    group = next(g for g in groups if g.side == side)
    other = next(g for g in groups if g.side != side)
    # The other side's worker may still be at work on the backlog it left (a slow fetch
    # runs on after its jobs were removed); this side's window starts when it has stopped.
    settled = _settle(other, timeout=drain_seconds(seconds))
    other_before = cpu_reading(other)
    # The harness's own CPU: this process, every thread (time.process_time).
    cpu_before, machine_before, harness_before = (
        cpu_reading(group),
        machine_cpu(),
        time.process_time(),
    )
    window_start = database.fetch_value("now")
    insert = _jobs(tag=uuid.uuid4().hex[:8], queue=queue, task=task, keyed=keyed)
    sent, offering, slowest_insert = _offer(rate, seconds, insert)
    window_end = database.fetch_value("now")
    worker_cpu, server_cpu = cpu_reading(group).since(cpu_before)
    other_worker, other_server = cpu_reading(other).since(other_before)
    machine_after, harness_cpu = machine_cpu(), time.process_time() - harness_before
    rows = _wait_ended(
        after=after,
        queue=queue,
        task=task,
        sent=sent,
        groups=groups,
        timeout=drain_seconds(seconds),
    )
    _discard(after)
    window = (window_end - window_start).total_seconds()
    # Each job's latency counts from when the schedule had it due (window start + n/rate),
    # so an insert that stalled shows as latency, not as a later deferral. The same horizon
    # for both sides: the schedule's end + the drain; a job not started by then had waited
    # at least until then, whenever the harness looked.
    horizon = window_start + timedelta(seconds=seconds + drain_seconds(seconds))
    latencies, censored = [], []
    starts = []
    for unit, _, started, _ in rows:
        due = window_start + timedelta(seconds=int(unit.rsplit("-", 1)[1]) / rate)
        if started is not None and started <= horizon:
            latencies.append((started - due).total_seconds() * 1000)
            starts.append(started)
        else:
            censored.append((horizon - due).total_seconds() * 1000)
    unstarted = sent - len(starts)
    everything = latencies + censored
    # The backlog from the schedule's end, as the horizon (an offering that overran its
    # window would otherwise hide jobs never started behind a backlog of 0).
    last_start = horizon if unstarted else max(starts)
    scheduled_end = window_start + timedelta(seconds=seconds)
    backlog = max(0.0, (last_start - scheduled_end).total_seconds())
    in_window = sum(started <= window_end for started in starts)
    quantiles = {q: percentile(everything, q) for q in (50, 99)}
    # A percentile is exact when every censored wait lies above it: the jobs' true waits,
    # longer still, leave it where it is. Otherwise it is only a lower bound.
    exact = {q: not censored or min(censored) > quantiles[q] for q in (50, 99)}
    return {
        "offered_per_s": sent / offering,
        "offering_s": round(offering, 3),
        "settle_s": round(settled, 3),
        "slowest_insert_s": round(slowest_insert, 3),
        "served_per_s": in_window / window,
        "p50_ms": quantiles[50],
        "p99_ms": quantiles[99],
        "p50_exact": exact[50],
        "p99_exact": exact[99],
        "backlog_s": round(backlog, 3),
        "keeps_up": backlog <= KEEP_UP_SECONDS and not unstarted,
        "jobs": len(rows),
        "unstarted": unstarted,
        # The window's CPU (every figure in CPU seconds per second of window): the side's
        # worker process and its server sessions, the harness (its offering loop), and the
        # whole machine busy, out of its CPUs.
        "cpu": {
            "worker": round(worker_cpu / offering, 3),
            "server": None if server_cpu is None else round(server_cpu / offering, 3),
            "harness": round(harness_cpu / offering, 3),
            # The other side's idle worker and its sessions, which should be near 0.
            "other_side": round((other_worker + (other_server or 0.0)) / offering, 3),
            "machine_busy": round((machine_after[0] - machine_before[0]) / offering, 3),
            "cpus": os.cpu_count(),
        },
    }


def run(ctx: Context) -> list[Row]:
    sizes = ctx.sizes
    found: dict[int, dict[str, dict[str, Any]]] = {}
    specs = _specs(ctx, "sustained", processes=1, concurrency=sizes.sustained_concurrency)
    try:
        with running(specs, log_dir=ctx.log_dir) as groups:
            for rate in sizes.sustained_rates:
                say(f"sustained load: {rate} jobs/s, plain")
                plain = _run_side(
                    ctx, groups, rate=rate, queue=PLAIN_QUEUE, task=NOOP_NEXT, keyed=False
                )
                say(f"sustained load: {rate} jobs/s, pgstage")
                stage = _run_side(ctx, groups, rate=rate, queue=STAGE_QUEUE, task=STAGE, keyed=True)
                found[rate] = {"plain": plain, "pgstage": stage}
    finally:
        database.delete_bench_jobs()
    return _rows(ctx, found)


def _rows(ctx: Context, found: dict[int, dict[str, dict[str, Any]]]) -> list[Row]:
    sizes = ctx.sizes
    rows = []
    common = {
        "seconds": sizes.sustained_seconds,
        "processes": 1,
        "concurrency": sizes.sustained_concurrency,
    }
    for rate, sides in found.items():
        plain, stage = sides["plain"], sides["pgstage"]
        profile = {"pgstage": stage, "plain": plain}
        rows.append(
            Row(
                key=f"sustained_{rate}_served",
                scenario=f"sustained {rate} jobs/s offered: jobs/s served",
                unit="jobs/s",
                measures=(
                    f"stage jobs (baseline: no-ops that defer their next hop) offered at {rate}/s "
                    f"for {sizes.sustained_seconds:g} s, one worker process at concurrency "
                    f"{sizes.sustained_concurrency}; jobs that started within the window ÷ "
                    f"its length. A side keeps up when its backlog at the window's end is at "
                    f"most {KEEP_UP_SECONDS:g} s (profile: keeps_up, backlog_s). The target "
                    "holds where plain procrastinate keeps up (pgstage keeps up wherever it "
                    "does); where it falls behind too, the row reports where each one falls "
                    "behind"
                ),
                parameters={**common, "offered_per_s": rate},
                result=series([stage["served_per_s"]]),
                baseline_label="plain procrastinate",
                baseline=series([plain["served_per_s"]]),
                target=Target(on="ratio", op=">=", value=0.95) if plain["keeps_up"] else None,
                profile=profile,
            )
        )
        for q in (50, 99):
            target = _latency_target(stage, plain, q)
            rows.append(
                Row(
                    key=f"sustained_{rate}_claim_p{q}",
                    scenario=f"sustained {rate} jobs/s offered: claim latency p{q}",
                    unit="ms",
                    measures=(
                        "per job, its first start (procrastinate's events, database clock) "
                        "- when the offering's schedule had it due (the window's start + "
                        f"its place / the rate), p{q} over every job of the schedule; a job "
                        "not started by the horizon (the same for both sides: "
                        f"{drain_seconds(sizes.sustained_seconds):g} s after the schedule's "
                        "end) counts with its wait until then, which makes a percentile "
                        "among such waits a lower bound. The target holds where the ratio's "
                        "bound allows a verdict: both figures exact, or pgstage's exact and "
                        "plain's a lower bound with the ratio within the target (the true "
                        "ratio is smaller), or pgstage's a lower bound with the ratio over "
                        "it; where neither, the row has no target"
                    ),
                    parameters={**common, "offered_per_s": rate},
                    result=series([stage[f"p{q}_ms"]]),
                    baseline_label="plain procrastinate",
                    baseline=series([plain[f"p{q}_ms"]]),
                    target=target,
                    profile={**profile, "quantile": q},
                )
            )
    for row in rows:
        _explain(row)
    return rows


def _latency_target(stage: dict[str, Any], plain: dict[str, Any], q: int) -> Target | None:
    """The latency target where the figures allow a verdict (see the row's text)."""
    target = Target(on="ratio", op="<=", value=1.2)
    mine, theirs = stage.get(f"p{q}_exact", True), plain.get(f"p{q}_exact", True)
    if mine and theirs:
        return target
    ratio = stage[f"p{q}_ms"] / plain[f"p{q}_ms"] if plain[f"p{q}_ms"] else float("inf")
    if mine and ratio <= target.value:
        return target  # plain's true figure is larger: the true ratio is smaller still
    if theirs and ratio > target.value:
        return target  # pgstage's true figure is larger: the true ratio is larger still
    return None


def _explain(row: Row) -> None:
    stage, plain = row.profile["pgstage"], row.profile["plain"]

    def side(name: str, figures: dict[str, Any]) -> str:
        kept = "keeps up" if figures["keeps_up"] else "falls behind"
        left = figures.get("unstarted", 0)
        backlog = (
            f"{left:,} jobs not started {figures['backlog_s']:g} s after the window"
            if left
            else f"backlog {figures['backlog_s']:g} s at the window's end"
        )
        cpu = figures.get("cpu") or {}
        used = ""
        if cpu.get("machine_busy") is not None and cpu.get("server") is not None:
            used = (
                f"; in the window the machine's {cpu['cpus']} CPU(s) were "
                f"{cpu['machine_busy'] / cpu['cpus']:.0%} busy: its worker "
                f"{cpu['worker']:.2f} CPU, its server sessions {cpu['server']:.2f}, the "
                f"offering harness {cpu['harness']:.2f}"
            )
            if cpu.get("other_side"):
                used += f", the other side's idle worker {cpu['other_side']:.2f}"
        late = ""
        if figures.get("slowest_insert_s", 0) > 1:
            late = (
                f"; the offering took {figures['offering_s']:.0f} s, its slowest insert "
                f"{figures['slowest_insert_s']:.1f} s (the jobs it held back count from "
                "when they were due)"
            )
        if figures.get("settle_s", 0) >= drain_seconds(row.parameters["seconds"]):
            late += "; the other side's worker was still busy when the window began"
        return (
            f"{name} {kept} ({backlog}, "
            f"{figures['served_per_s']:.0f} jobs/s served of {figures['offered_per_s']:.0f} "
            f"offered{used}{late})"
        )

    row.cause = f"{side('pgstage', stage)}; {side('plain procrastinate', plain)}"
    q = row.profile.get("quantile")
    if q is not None:
        bounds = [
            f"{name}'s p{q} is a lower bound (jobs not started by the horizon reach it)"
            for name, figures in (("pgstage", stage), ("plain procrastinate", plain))
            if not figures.get(f"p{q}_exact", True)
        ]
        if bounds:
            row.cause += "; " + "; ".join(bounds)
        if row.target is None:
            row.cause += ": the ratio allows no verdict"
    if row.key.endswith("_served") and plain["keeps_up"] and not stage["keeps_up"]:
        row.cause += "; pgstage falls behind where plain procrastinate keeps up"
