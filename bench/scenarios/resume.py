"""The resume sweep (``analysis_resume``) when it has nothing to do.

The state it meets in a steady production: U users, each with an active (``pending``) job
whose ``process_job`` waits in the queue and two ``queued`` jobs behind it, all admitted
through ``analysis_job_admit`` and then left untouched past the sweep's grace (rows
back-dated), with planner statistics as autovacuum keeps them (an ``ANALYZE`` after the
setup: a table just filled has none, and on the planner's guesses the statements' server
time was 2.5 ms against 1.2 ms, by EXPLAIN ANALYZE). Nothing is stuck, expired or lost,
so a call changes nothing (checked: a call that changes anything makes the scenario fail
instead of timing it): it is the sweep's one read-only probe of every part. Each sample
times one ``run_sweep("analysis_resume")`` in this process, after one call to warm up.
"""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from bench import database
from bench.harness import Row, Target, say, series, timed
from bench.scenarios.common import (
    Context,
    admit,
    bench_tenant,
    counts_text,
    funded_users,
    through,
    top_work,
)
from bench.wire import WireCounter
from bench.workers import BenchError
from queueing.sweeps import get_sweep, run_sweep

SWEEP = "analysis_resume"
JOBS_PER_USER = 3


def _call_ms() -> float:
    return timed(lambda: run_sweep(SWEEP)) * 1000


def run(ctx: Context) -> list[Row]:
    users_count = ctx.sizes.resume_users
    tenant = bench_tenant("resume")
    try:
        say(f"resume sweep: admitting {users_count * JOBS_PER_USER} jobs")
        users = funded_users(tenant, users_count, credits=JOBS_PER_USER)
        for user in users:
            for _ in range(JOBS_PER_USER):
                admit(user)
        grace = get_sweep(SWEEP).grace_seconds
        database.execute("backdate_jobs", seconds=grace + 60, users=[u.pk for u in users])
        database.execute("analyze_queue_tables")
        first = run_sweep(SWEEP)
        if first.changed or first.failed:
            raise BenchError(
                f"the resume sweep found work where it should find none ({first}): the "
                "scenario's state no longer means 'nothing to do'"
            )
        say("resume sweep: timing")
        samples = [_call_ms() for _ in range(max(3, ctx.sizes.sweep_calls))]
        with WireCounter(ctx.params) as counter:

            def counted():
                before = counter.snapshot()
                with CaptureQueriesContext(connection) as captured:
                    run_sweep(SWEEP)
                return counter.snapshot() - before, captured.captured_queries

            counts, captured = through(counter, counted)
    finally:
        database.purge_tenant(tenant.pk)
    slowest = sorted(captured, key=lambda q: -float(q["time"]))[:3]
    row = Row(
        key="resume_sweep_idle",
        scenario="resume sweep with nothing to do",
        unit="ms",
        measures=(
            f"one run_sweep('{SWEEP}') call in this process, {users_count} users each with "
            f"an active job (its process_job waiting) and {JOBS_PER_USER - 1} queued, all "
            "idle past the grace, the tables analysed; after one warm-up call"
        ),
        parameters={
            "users": users_count,
            "active_per_user": 1,
            "queued_per_user": JOBS_PER_USER - 1,
            "calls": len(samples),
        },
        result=series(samples),
        target=Target(on="figure", op="<=", value=5),
        profile={
            "counts": {"pgstage": counts.per(1, top=8)},
            "slowest_statements": [
                {"ms": round(float(q["time"]) * 1000, 2), "statement": q["sql"][:200]}
                for q in slowest
            ],
        },
    )
    if row.met is False:
        per_call = row.profile["counts"]["pgstage"]
        row.cause = (
            f"a call that changes nothing takes {counts_text(per_call)}; the work "
            f"statements: {top_work(per_call, width=90)} (the probe of every part: one "
            f"index probe per queued user, per active job and per unfinished core run; "
            f"{users_count} users, {users_count * JOBS_PER_USER} jobs, each with its held "
            "core run); the slowest in the counted call, on a fresh connection (the probe is "
            "prepared there), as Django timed them: "
            + "; ".join(
                f"{q['ms']:g} ms `{q['statement'][:60]}`" for q in row.profile["slowest_statements"]
            )
        )
    return [row]
