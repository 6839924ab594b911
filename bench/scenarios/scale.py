"""What an idle sweep and a metrics scrape cost as the tables grow.

* ``unsaved_runs`` finding nothing: N terminal jobs that still hold their body, each saved
  by the client (its run holds it), past the grace — bulk-inserted with
  ``generate_series`` (``bench.sql``), then ``VACUUM ANALYZE``. Each sample times one
  ``run_sweep("unsaved_runs")`` in this process, after one warm-up call; a call that finds
  anything fails the scenario instead (the bulk rows no longer mean "saved"). Measured at
  the small size, then again after growing the tables to the large size.
* ``/metrics`` at the large size: procrastinate's job table holds as many finished jobs as
  there are analysis jobs; each sample times one scrape (``generate_latest`` of the
  metrics registry, what the view returns), after one warm-up.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from prometheus_client import generate_latest

from bench import database
from bench.harness import Row, Target, say, series, timed
from bench.scenarios.common import Context, bench_tenant, count_label
from bench.workers import BenchError
from queueing.sweeps import get_sweep, run_sweep
from runs.core import queries as runs_queries

SWEEP = "unsaved_runs"
METRICS_QUEUE = "bench_metrics"
BODY = "<p>Water boils at one hundred degrees at sea level [thermo].</p>"
RESULTS = {"judge": "overlap-v1", "verdicts": [], "summary": {"citations": 1}}


def _grow(tenant_id: int, user_id: int, count: int) -> None:
    after = database.fetch_value("last_analysis_job_id")
    with transaction.atomic():
        database.execute(
            "saved_jobs_insert",
            tenant=tenant_id,
            user=user_id,
            count=count,
            body=BODY,
            results=json.dumps(RESULTS),
        )
        database.execute("saved_runs_insert", user=user_id, after=after)


def _analyze(*tables: str) -> None:
    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {table}")


def _sweep_samples(calls: int) -> list[float]:
    first = run_sweep(SWEEP)
    if first.selected or first.failed:
        raise BenchError(
            f"the {SWEEP} sweep found {first.selected} job(s) among rows inserted as saved: "
            "the schema's notion of 'saved' changed; update saved_jobs_insert and "
            "saved_runs_insert in bench/sql/bench.sql"
        )
    return [timed(lambda: run_sweep(SWEEP)) * 1000 for _ in range(calls)]


def _plan(grace: int, batch: int) -> dict[str, Any]:
    """The sweep's select under EXPLAIN ANALYZE: what each scan visited."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + runs_queries[SWEEP],
            {"grace_seconds": grace, "limit": batch},
        )
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    lines: list[str] = []
    visited = [0]

    def walk(node: dict[str, Any]) -> None:
        if "Relation Name" in node or "Index Name" in node:
            rows = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
            visited[0] = max(visited[0], rows + node.get("Rows Removed by Filter", 0))
            target = node.get("Index Name") or node.get("Relation Name")
            removed = node.get("Rows Removed by Filter", 0)
            lines.append(
                f"{node['Node Type']} on {target}: {rows:,.0f} rows"
                + (f" ({removed:,} removed by filter)" if removed else "")
                + f", {node.get('Actual Loops', 1):,} loop(s), "
                f"{node.get('Shared Hit Blocks', 0) + node.get('Shared Read Blocks', 0):,} "
                "buffers"
            )
        for child in node.get("Plans", []):
            walk(child)

    top = plan[0]
    walk(top["Plan"])
    lines.append(f"execution {top['Execution Time']:.1f} ms")
    return {"nodes": lines, "rows_visited": visited[0]}


def _scrape_ms() -> float:
    from queueing.metrics import REGISTRY

    return timed(lambda: generate_latest(REGISTRY)) * 1000


def _scrape_profile() -> list[dict[str, Any]]:
    from queueing.metrics import REGISTRY

    with CaptureQueriesContext(connection) as captured:
        generate_latest(REGISTRY)
    return [
        {"ms": round(float(q["time"]) * 1000, 1), "statement": q["sql"][:160]}
        for q in sorted(captured.captured_queries, key=lambda q: -float(q["time"]))
    ]


def run(ctx: Context) -> list[Row]:
    sizes = ctx.sizes
    small, large = sizes.sweep_small, sizes.sweep_large
    calls = max(3, sizes.sweep_calls)
    sweep = get_sweep(SWEEP)
    tenant = bench_tenant("sweeps")
    from accounts.services import user_get_or_create

    user = user_get_or_create(tenant=tenant, username=tenant.slug)
    plans: dict[str, dict[str, Any]] = {}
    try:
        say(f"sweeps: inserting {count_label(small)} saved jobs")
        _grow(tenant.pk, user.pk, small)
        _analyze("analysis_jobs", "analysis_runs")
        say(f"sweeps: timing {SWEEP} at {count_label(small)}")
        small_ms = _sweep_samples(calls)
        plans[count_label(small)] = _plan(sweep.grace_seconds, sweep.batch_size)
        say(f"sweeps: growing to {count_label(large)} saved jobs and finished jobs")
        _grow(tenant.pk, user.pk, large - small)
        database.execute("finished_jobs_insert", queue=METRICS_QUEUE, count=large)
        _analyze("analysis_jobs", "analysis_runs", "procrastinate_jobs")
        say(f"sweeps: timing {SWEEP} at {count_label(large)}")
        large_ms = _sweep_samples(calls)
        plans[count_label(large)] = _plan(sweep.grace_seconds, sweep.batch_size)
        say(f"metrics: timing scrapes at {count_label(large)}")
        _scrape_ms()
        scrape_ms = [_scrape_ms() for _ in range(calls)]
        scrape_profile = _scrape_profile()
    finally:
        say("sweeps: removing the bulk rows")
        database.purge_tenant(tenant.pk)
        database.delete_bench_jobs()
        # Without autovacuum a million dead rows stay in the tables and their indexes, and
        # whatever runs next on this database walks them (an admit took 70 ms, not 2).
        _analyze("analysis_jobs", "analysis_runs", "procrastinate_jobs", "procrastinate_events")

    parameters = {"body_bytes": len(BODY), "calls": calls, "batch_size": sweep.batch_size}
    small_row, large_row = (
        Row(
            key=f"unsaved_sweep_{which}",
            scenario=f"unsaved_runs sweep finding nothing, {count_label(size)} saved jobs",
            unit="ms",
            measures=_SWEEP_MEASURES,
            parameters={"saved_jobs": size, **parameters},
            result=series(samples),
            target=target,
            profile={"plan": plans[count_label(size)]},
        )
        for which, size, samples, target in (
            ("small", small, small_ms, None),
            ("large", large, large_ms, Target(on="figure", op="<=", value=5)),
        )
    )
    growth = Row(
        key="unsaved_sweep_growth",
        scenario=f"unsaved_runs sweep, {count_label(large)}/{count_label(small)} growth",
        unit="x",
        measures="the large size's time per call ÷ the small size's (pairwise per call)",
        parameters={"small": small, "large": large},
        result=series([a / b for a, b in zip(large_ms, small_ms, strict=True)]),
        target=Target(on="figure", op="<=", value=2),
    )
    scrape = Row(
        key="metrics_scrape",
        scenario=f"/metrics scrape at {count_label(large)} jobs",
        unit="ms",
        measures=(
            "one generate_latest() of the /metrics registry in this process (every "
            f"collector's queries), with {count_label(large)} finished procrastinate jobs, "
            f"{count_label(large)} analysis jobs and runs; after one warm-up"
        ),
        parameters={
            "procrastinate_jobs": large,
            "analysis_jobs": large,
            "analysis_runs": large,
            "calls": calls,
        },
        result=series(scrape_ms),
        target=Target(on="figure", op="<=", value=50),
        profile={"statements": scrape_profile},
    )
    if large_row.met is False or growth.met is False:
        plan = large_row.profile["plan"]
        cause = (
            f"not yet optimised: to find nothing, the sweep's select visits "
            f"{plan['rows_visited']:,.0f} rows at {count_label(large)} saved jobs "
            f"(EXPLAIN ANALYZE: {'; '.join(plan['nodes'])})"
        )
        large_row.cause = cause
        growth.cause = cause
    if scrape.met is False:
        slowest = scrape.profile["statements"][:3]
        scrape.cause = "not yet bounded: every scrape aggregates whole tables; slowest: " + (
            "; ".join(f"{s['ms']:g} ms `{s['statement'][:90]}`" for s in slowest)
        )
    return [small_row, large_row, growth, scrape]


_SWEEP_MEASURES = (
    "one run_sweep('unsaved_runs') call in this process over bulk-inserted saved jobs "
    "(VACUUM ANALYZE after the insert), after one warm-up call"
)
