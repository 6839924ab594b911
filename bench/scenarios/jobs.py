"""Jobs on real worker processes (``bench.workers``), pgstage against plain procrastinate.

* stage jobs: a batch of N ``bench.stage`` jobs (claim → no work → complete + enqueue the
  next hop, EXCLUSIVE key) against N ``bench.noop_next`` (a no-op that defers its next
  hop); jobs/s = N ÷ (last job's end - first job's start), from procrastinate's events.
  With one process at concurrency 1 and 4, and with 2 and 4 processes at concurrency 1
  (the scaling figures); at concurrency 1 also against N ``bench.noop`` (a no-op that
  defers nothing).
* inquiries: N inquiries submitted through ``anfrage_submit`` (one small text file each),
  all four stages run by one worker (concurrency 1), against N plain 4-hop chains;
  inquiries/s = N ÷ (last end - first start).
* one inquiry at a time on an idle, warm worker: from the database clock just before
  ``anfrage_submit`` to the end of its ``calculate`` job, against a plain 4-hop chain from
  just before its first defer to the end of its fourth hop; p50 per repetition.
* worker peak RSS: every worker process of the sessions above, read at exit.
* round trips per job: the same jobs with each side's workers connected through a
  counting proxy (``bench.wire``); and pg_stat_statements' calls when the server has it.
* the stages' own work: the four stages of inquiries run in the bench process, no worker
  and no queue (``pipeline_stage_run`` one after another), timed per stage: all of it and
  the part spent in statements (from sending to the last row read; BEGIN and COMMIT
  excluded). What is left for the queue when a target is to be met is set against it.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench import database
from bench.harness import Row, Series, Target, alternate, percentile, say, series
from bench.scenarios.common import Context, bench_tenant, counts_text, top_work
from bench.tasks import (
    CHAIN_HOPS,
    HOP,
    NOOP,
    NOOP_NEXT,
    NOOP_TASK,
    STAGE,
    STAGE_KEY,
    chain_hop,
    noop,
    noop_next,
)
from bench.wire import WireCounter
from bench.workers import BenchError, GroupSpec, WorkerGroup, counted_batch, run_batch, running
from pipeline.models import Stage
from pipeline.stages import TASK_NAMES
from pipeline.submit import Upload, anfrage_submit
from queueing.enqueue import Policy, enqueue

PLAIN_QUEUE = "bench_plain"
STAGE_QUEUE = "bench_stage"
#: The pipeline's stages run on their tasks' queue.
PIPELINE_QUEUE = "default"
PIPELINE_TASKS = list(TASK_NAMES.values())
CALCULATE = TASK_NAMES[Stage.CALCULATE]
ITEMS = b"12 pcs steel beam HEA 200, 6 m\n30 m Flachstahl 40x5\n200 Stk Schrauben M12 V2A\n"


# --- batches ------------------------------------------------------------------------


def _stage_jobs(n: int) -> Callable[[], None]:
    tag = uuid.uuid4().hex[:8]

    def enqueue_all() -> None:
        for i in range(n):
            unit = f"{tag}-{i}"
            enqueue(
                STAGE,
                args={"unit": unit},
                queue=STAGE_QUEUE,
                key=STAGE_KEY.build(hop="stage", unit=unit),
                policy=Policy.EXCLUSIVE,
            )

    return enqueue_all


def _noop_jobs(n: int) -> Callable[[], None]:
    tag = uuid.uuid4().hex[:8]

    def defer_all() -> None:
        for i in range(n):
            noop_next.configure(queue=PLAIN_QUEUE).defer(unit=f"{tag}-{i}")

    return defer_all


def _bare_jobs(n: int) -> Callable[[], None]:
    def defer_all() -> None:
        for _ in range(n):
            noop.configure(queue=PLAIN_QUEUE).defer()

    return defer_all


def _noop_tasks(n: int) -> Callable[[], None]:
    """pgstage's no-op (``bench.noop_task``), on the queue pgstage's stage workers take."""

    def enqueue_all() -> None:
        for _ in range(n):
            enqueue(NOOP_TASK, queue=STAGE_QUEUE)

    return enqueue_all


def _chains(n: int) -> Callable[[], None]:
    tag = uuid.uuid4().hex[:8]

    def defer_all() -> None:
        for i in range(n):
            chain_hop.configure(queue=PLAIN_QUEUE).defer(chain=f"{tag}-{i}", hop=1)

    return defer_all


def _inquiries(tenant, n: int) -> Callable[[], None]:
    def submit_all() -> None:
        for _ in range(n):
            _submit(tenant)

    return submit_all


def _submit(tenant):
    return anfrage_submit(
        tenant=tenant, uploads=[Upload(filename="items.txt", data=ITEMS)], actor="bench"
    )


def _specs(
    ctx: Context,
    name: str,
    *,
    processes: int,
    concurrency: int,
    pipeline: bool = False,
    urls: dict[str, str] | None = None,
) -> list[GroupSpec]:
    urls = urls or {"plain": ctx.database_url, "pgstage": ctx.database_url}
    return [
        GroupSpec(
            side="plain",
            name=f"{name}-plain",
            queues=(PLAIN_QUEUE,),
            processes=processes,
            concurrency=concurrency,
            database_url=urls["plain"],
        ),
        GroupSpec(
            side="pgstage",
            name=f"{name}-pgstage",
            queues=(STAGE_QUEUE, PIPELINE_QUEUE) if pipeline else (STAGE_QUEUE,),
            processes=processes,
            concurrency=concurrency,
            database_url=urls["pgstage"],
        ),
    ]


def _warm_up(groups: list[WorkerGroup], *, tenant=None) -> None:
    """A first batch per side (imports, connections, caches), not measured."""
    slots = len(groups[0].processes) * groups[0].concurrency
    n = 3 * slots
    run_batch(_noop_jobs(n), queues=[PLAIN_QUEUE], tasks=[NOOP_NEXT], expected=n, groups=groups)
    run_batch(_stage_jobs(n), queues=[STAGE_QUEUE], tasks=[STAGE], expected=n, groups=groups)
    if tenant is not None:
        run_batch(_chains(1), queues=[PLAIN_QUEUE], tasks=[HOP], expected=CHAIN_HOPS, groups=groups)
        run_batch(
            _inquiries(tenant, 1),
            queues=[PIPELINE_QUEUE],
            tasks=PIPELINE_TASKS,
            expected=len(PIPELINE_TASKS),
            groups=groups,
        )


# --- measurements -------------------------------------------------------------------


def _stage_rates(
    ctx: Context,
    groups: list[WorkerGroup],
    *,
    bare: bool = False,
    per_job: dict[str, list[dict[str, float | None]]] | None = None,
) -> dict[str, tuple[Series, Series]]:
    """pgstage's stage jobs/s against the no-op that defers its next hop's, alternately
    (``stage``); with ``bare``, also against the no-op that defers nothing (``bare``), and
    pgstage's no-op task on pgstage's worker against that plain no-op (``noop``). Each
    batch's wall time, worker CPU and server CPU per job go to ``per_job`` by kind."""
    n = ctx.sizes.stage_jobs
    plain_group, pgstage_group = groups
    bare_rates: list[float] = []
    noop_task_rates: list[float] = []

    def batch(kind: str, enqueue_all, queue: str, task: str, group: WorkerGroup) -> float:
        span = run_batch(
            enqueue_all, queues=[queue], tasks=[task], expected=n, groups=groups, cpu_of=group
        )
        if per_job is not None:
            per_job.setdefault(kind, []).append(span.per_job_ms())
        return span.rate

    def plain(_r: int) -> float:
        if bare:
            bare_rates.append(batch("noop", _bare_jobs(n), PLAIN_QUEUE, NOOP, plain_group))
        return batch("noop_next", _noop_jobs(n), PLAIN_QUEUE, NOOP_NEXT, plain_group)

    def pgstage(_r: int) -> float:
        if bare:
            noop_task_rates.append(
                batch("noop_task", _noop_tasks(n), STAGE_QUEUE, NOOP_TASK, pgstage_group)
            )
        return batch("stage", _stage_jobs(n), STAGE_QUEUE, STAGE, pgstage_group)

    measured, baseline = alternate(ctx.sizes.repetitions, plain, pgstage)
    found = {"stage": (measured, baseline)}
    if bare:
        found["bare"] = measured, series(bare_rates)
        found["noop"] = series(noop_task_rates), series(bare_rates)
    return found


def _inquiry_rates(ctx: Context, groups: list[WorkerGroup], tenant) -> tuple[Series, Series]:
    n = ctx.sizes.inquiries
    jobs = n * CHAIN_HOPS

    def plain(_r: int) -> float:
        span = run_batch(
            _chains(n), queues=[PLAIN_QUEUE], tasks=[HOP], expected=jobs, groups=groups
        )
        return n / span.seconds

    def pgstage(_r: int) -> float:
        span = run_batch(
            _inquiries(tenant, n),
            queues=[PIPELINE_QUEUE],
            tasks=PIPELINE_TASKS,
            expected=n * len(PIPELINE_TASKS),
            groups=groups,
        )
        return n / span.seconds

    return alternate(ctx.sizes.repetitions, plain, pgstage)


def _end_of(after: int, task: str, args: dict[str, Any], groups: list[WorkerGroup]):
    """The database time the job of ``task`` with ``args`` ended; waits for it."""
    deadline = time.monotonic() + 120
    checked = time.monotonic()
    while True:
        end = database.fetch_value("job_end", after=after, task=task, args=json.dumps(args))
        if end is not None:
            return end
        if time.monotonic() - checked > 1:
            checked = time.monotonic()
            if database.fetch_value("job_broken", after=after):
                raise BenchError(f"a bench job after {after} failed or was retried")
            for group in groups:
                group.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"{task} {args} did not end within 120 s")
        time.sleep(0.005)


def _latencies(ctx: Context, groups: list[WorkerGroup], tenant) -> tuple[Series, Series]:
    k = ctx.sizes.latency_samples

    def chain_ms() -> float:
        after = database.last_job_id()
        chain = uuid.uuid4().hex[:12]
        start = database.fetch_value("now")
        chain_hop.configure(queue=PLAIN_QUEUE).defer(chain=chain, hop=1)
        end = _end_of(after, HOP, {"chain": chain, "hop": CHAIN_HOPS}, groups)
        database.execute("delete_batch", after=after)
        return (end - start).total_seconds() * 1000

    def inquiry_ms() -> float:
        after = database.last_job_id()
        start = database.fetch_value("now")
        anfrage = _submit(tenant)
        end = _end_of(after, CALCULATE, {"anfrage_id": anfrage.id}, groups)
        database.execute("delete_batch", after=after)
        return (end - start).total_seconds() * 1000

    return alternate(
        ctx.sizes.repetitions,
        lambda _r: percentile([chain_ms() for _ in range(k)], 50),
        lambda _r: percentile([inquiry_ms() for _ in range(k)], 50),
    )


def _counted(ctx: Context, tenant) -> dict[str, list[dict[str, Any]]]:
    """Per repetition, each side's counts per job (stage, no-op) and per inquiry/chain."""
    k, k_inq = ctx.sizes.counted_jobs, ctx.sizes.counted_inquiries
    found: dict[str, list[dict[str, Any]]] = {"stage": [], "noop": [], "inquiry": [], "chain": []}
    with WireCounter(ctx.params) as plain_wire, WireCounter(ctx.params) as stage_wire:
        specs = _specs(
            ctx,
            "counted",
            processes=1,
            concurrency=1,
            pipeline=True,
            urls={"plain": plain_wire.url, "pgstage": stage_wire.url},
        )
        with running(specs, log_dir=ctx.log_dir) as groups:
            _warm_up(groups, tenant=tenant)

            def measure(name: str, wire: WireCounter, units: int, **batch: Any) -> None:
                counters = [wire.snapshot]
                if ctx.server.statements:
                    counters.append(database.statement_calls)
                diffs = counted_batch(groups=groups, counters=counters, **batch)
                entry = diffs[0].per(units)
                if ctx.server.statements:
                    calls = diffs[1]
                    checks = {q for q in calls if database.FOREIGN_KEY_CHECK.match(q)}
                    sent = {q: n for q, n in calls.items() if q not in checks}
                    entry["pg_stat_statements"] = {
                        "statements": sum(sent.values()) / units,
                        "foreign_key_checks": sum(calls[q] for q in checks) / units,
                        "top_statements": [
                            {"calls_per_unit": round(n / units, 3), "statement": q[:240]}
                            for q, n in sorted(sent.items(), key=lambda kv: -kv[1])[:12]
                        ],
                    }
                found[name].append(entry)

            batches = (
                ("noop", plain_wire, k, _noop_jobs, PLAIN_QUEUE, [NOOP_NEXT], 1),
                ("stage", stage_wire, k, _stage_jobs, STAGE_QUEUE, [STAGE], 1),
                ("chain", plain_wire, k_inq, _chains, PLAIN_QUEUE, [HOP], CHAIN_HOPS),
                (
                    "inquiry",
                    stage_wire,
                    k_inq,
                    lambda n: _inquiries(tenant, n),
                    PIPELINE_QUEUE,
                    PIPELINE_TASKS,
                    len(PIPELINE_TASKS),
                ),
            )
            for rep in range(ctx.sizes.repetitions):
                say(f"round trips: repetition {rep + 1}/{ctx.sizes.repetitions}")
                for name, wire, units, batch, queue, tasks, jobs_per_unit in batches:
                    measure(
                        name,
                        wire,
                        units,
                        enqueue=batch(units),
                        queue=queue,
                        tasks=tasks,
                        expected=units * jobs_per_unit,
                    )
    return found


def _stage_work(ctx: Context, tenant) -> dict[str, Any]:
    """The four stages of ``counted_inquiries`` inquiries run in this process (no worker,
    no queue), per repetition; per stage and per inquiry the p50 of wall time and of the
    time spent in statements, in ms."""
    from django.db import connection

    from pipeline.stages import pipeline_stage_run

    in_statements = [0.0]

    def clocked(execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            in_statements[0] += time.perf_counter() - started

    wall: dict[str, list[float]] = {stage.value: [] for stage in Stage}
    statements: dict[str, list[float]] = {stage.value: [] for stage in Stage}
    inquiry_wall, inquiry_statements, submits = [], [], []
    for rep in range(ctx.sizes.repetitions):
        say(f"stage work in-process: repetition {rep + 1}/{ctx.sizes.repetitions}")
        after = database.last_job_id()
        ids = []
        for _ in range(ctx.sizes.counted_inquiries):
            started = time.perf_counter()
            ids.append(_submit(tenant).id)
            submits.append((time.perf_counter() - started) * 1000)
        with connection.execute_wrapper(clocked):
            for anfrage_id in ids:
                total = total_statements = 0.0
                for stage in Stage:
                    in_statements[0] = 0.0
                    started = time.perf_counter()
                    outcome = pipeline_stage_run(anfrage_id=anfrage_id, stage=stage)
                    took = time.perf_counter() - started
                    if outcome != "completed":
                        raise BenchError(f"{stage.value} of inquiry {anfrage_id}: {outcome}")
                    wall[stage.value].append(took * 1000)
                    statements[stage.value].append(in_statements[0] * 1000)
                    total += took * 1000
                    total_statements += in_statements[0] * 1000
                inquiry_wall.append(total)
                inquiry_statements.append(total_statements)
        database.execute("delete_batch", after=after)
    return {
        "per_stage_ms": {
            stage: {
                "wall_p50": round(percentile(wall[stage], 50), 2),
                "statements_p50": round(percentile(statements[stage], 50), 2),
            }
            for stage in wall
        },
        "per_inquiry_ms": {
            "wall_p50": round(percentile(inquiry_wall, 50), 2),
            "statements_p50": round(percentile(inquiry_statements, 50), 2),
        },
        "submit_ms_p50": round(percentile(submits, 50), 2),
    }


# --- the scenario -------------------------------------------------------------------


def run(ctx: Context) -> list[Row]:
    sizes = ctx.sizes
    tenant = bench_tenant("pipeline")
    rss: dict[str, list[float]] = {"plain": [], "pgstage": []}
    rates: dict[str, tuple[Series, Series]] = {}
    cpu: dict[str, dict[str, list[dict[str, float | None]]]] = {}

    def session(name: str, processes: int, concurrency: int, body) -> None:
        say(f"workers: starting {name} ({processes} x concurrency {concurrency})")
        specs = _specs(
            ctx, name, processes=processes, concurrency=concurrency, pipeline=name == "c1"
        )
        with running(specs, log_dir=ctx.log_dir) as groups:
            _warm_up(groups, tenant=tenant if name == "c1" else None)
            say(f"workers: measuring {name}")
            body(groups)
        for group in groups:
            rss[group.side] += [kib / 1024 for kib in group.peak_rss_kib]

    try:

        def c1(groups):
            found = _stage_rates(ctx, groups, bare=True, per_job=cpu.setdefault("c1", {}))
            rates["c1"] = found["stage"]
            rates["c1_bare"] = found["bare"]
            rates["c1_noop"] = found["noop"]
            rates["inquiries"] = _inquiry_rates(ctx, groups, tenant)
            rates["latency"] = _latencies(ctx, groups, tenant)

        session("c1", 1, 1, c1)
        session(
            "c4",
            1,
            4,
            lambda groups: rates.__setitem__(
                "c4", _stage_rates(ctx, groups, per_job=cpu.setdefault("c4", {}))["stage"]
            ),
        )
        for processes in sizes.worker_processes:
            if processes > 1:
                session(
                    f"p{processes}",
                    processes,
                    1,
                    lambda groups, p=processes: rates.__setitem__(
                        f"p{p}", _stage_rates(ctx, groups)["stage"]
                    ),
                )
        counted = _counted(ctx, tenant)
        work = _stage_work(ctx, tenant)
    finally:
        database.purge_tenant(tenant.pk)
        database.delete_bench_jobs()
    return _rows(ctx, rates, rss, counted, work, cpu)


def _per_job(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The median repetition's counts."""
    return sorted(entries, key=lambda e: e["round_trips"])[len(entries) // 2]


def _rows(
    ctx: Context,
    rates: dict[str, tuple[Series, Series]],
    rss: dict[str, list[float]],
    counted: dict[str, list[dict[str, Any]]],
    work: dict[str, Any],
    cpu: dict[str, dict[str, list[dict[str, float | None]]]],
) -> list[Row]:
    sizes = ctx.sizes
    per_job = {
        session: {kind: _median_ms(entries) for kind, entries in kinds.items()}
        for session, kinds in cpu.items()
    }
    n = sizes.stage_jobs
    stage_counts, noop_counts = _per_job(counted["stage"]), _per_job(counted["noop"])
    inquiry_counts, chain_counts = _per_job(counted["inquiry"]), _per_job(counted["chain"])
    stage_name = "stage job (claim → work → complete + enqueue next)"
    baseline_label = "no-op that defers its next hop"
    rows = []
    for key, concurrency in (("c1", 1), ("c4", 4)):
        measured, baseline = rates[key]
        rows.append(
            Row(
                key=f"stage_jobs_{key}",
                scenario=f"{stage_name}, concurrency {concurrency}",
                unit="jobs/s",
                measures=(
                    f"{n:,} jobs enqueued in one transaction, one worker process at concurrency "
                    f"{concurrency}; first job's start → last job's end (procrastinate's events)"
                ),
                parameters={"jobs": n, "processes": 1, "concurrency": concurrency},
                result=measured,
                baseline_label=baseline_label,
                baseline=baseline,
                target=Target(on="ratio", op=">=", value=1.3),
                profile={"per_job_ms": per_job.get(key, {})},
            )
        )
    measured, baseline = rates["c1_bare"]
    rows.append(
        Row(
            key="stage_jobs_c1_bare",
            scenario=f"{stage_name}, concurrency 1, against a no-op",
            unit="jobs/s",
            measures=(
                f"as the concurrency-1 row; the baseline: {n:,} plain no-ops that defer nothing "
                "(bench.noop)"
            ),
            parameters={"jobs": n, "processes": 1, "concurrency": 1},
            result=measured,
            baseline_label="no-op that defers nothing",
            baseline=baseline,
            target=Target(on="ratio", op=">=", value=1.0),
            profile={"per_job_ms": per_job.get("c1", {})},
        )
    )
    measured, baseline = rates["c1_noop"]
    rows.append(
        Row(
            key="noop_task_c1",
            scenario="a job that does nothing, pgstage's worker, concurrency 1",
            unit="jobs/s",
            measures=(
                f"{n:,} pgstage tasks with an empty body (bench.noop_task: queueing.app.task) on "
                "pgstage's worker, in turns with the concurrency-1 stage batches; the baseline: "
                "the plain no-ops that defer nothing on procrastinate's worker"
            ),
            parameters={"jobs": n, "processes": 1, "concurrency": 1},
            result=measured,
            baseline_label="no-op that defers nothing, procrastinate's worker",
            baseline=baseline,
            profile={"per_job_ms": per_job.get("c1", {})},
        )
    )
    one_measured, one_baseline = rates["c1"]
    for processes in sizes.worker_processes:
        if processes == 1:
            continue
        measured, baseline = rates[f"p{processes}"]
        rows.append(
            Row(
                key=f"stage_jobs_p{processes}",
                scenario=f"stage jobs/s, {processes} worker processes (concurrency 1 each)",
                unit="jobs/s",
                measures=(
                    f"{n:,} stage jobs (baseline: no-op jobs) enqueued in one transaction, "
                    f"{processes} worker processes; first start → last end"
                ),
                parameters={"jobs": n, "processes": processes, "concurrency": 1},
                result=measured,
                baseline_label=f"{baseline_label}, {processes} processes",
                baseline=baseline,
                profile={
                    "scaling_vs_one_process": measured.median / one_measured.median,
                    "baseline_scaling_vs_one_process": baseline.median / one_baseline.median,
                },
            )
        )
    rows.append(
        Row(
            key="worker_peak_rss",
            scenario="worker peak RSS",
            unit="MB",
            measures=(
                "peak resident set size of each worker process of the stage and inquiry "
                "sessions (the kernel's VmHWM, read just before the process is stopped); one "
                "sample per process"
            ),
            parameters={"processes_per_side": len(rss["pgstage"])},
            result=series(rss["pgstage"]) if rss["pgstage"] else None,
            baseline_label="plain procrastinate worker",
            baseline=series(rss["plain"]) if rss["plain"] else None,
            target=Target(on="ratio", op="<=", value=1.1),
            error=None if rss["pgstage"] else "no VmHWM to read: peak RSS needs Linux's /proc",
        )
    )
    measured, baseline = rates["inquiries"]
    rows.append(
        Row(
            key="inquiries_throughput",
            scenario="four-stage inquiries/s, one worker",
            unit="inquiries/s",
            measures=(
                f"{sizes.inquiries} inquiries submitted in one transaction (anfrage_submit, "
                "one 3-line text file each), one worker at concurrency 1 runs all four "
                "stages; first job's start → last job's end"
            ),
            parameters={"inquiries": sizes.inquiries, "processes": 1, "concurrency": 1},
            result=measured,
            baseline_label="plain 4-hop no-op chains/s",
            baseline=baseline,
            target=Target(on="ratio", op=">=", value=0.7),
            profile={"stage_work_in_process": work},
        )
    )
    measured, baseline = rates["latency"]
    rows.append(
        Row(
            key="inquiry_latency_p50",
            scenario="one inquiry, submit → calculate success, p50",
            unit="ms",
            measures=(
                "an idle, warm worker (concurrency 1); database clock just before "
                "anfrage_submit → the calculate job's end; the baseline: just before the first "
                f"defer → the fourth hop's end; p50 of {sizes.latency_samples} per repetition"
            ),
            parameters={"samples_per_repetition": sizes.latency_samples},
            result=measured,
            baseline_label="plain 4-hop chain",
            baseline=baseline,
            target=Target(on="ratio", op="<=", value=1.5),
            profile={"stage_work_in_process": work},
        )
    )
    rows.append(
        Row(
            key="stage_round_trips",
            scenario="round trips per stage job",
            unit="round trips",
            measures=(
                f"{sizes.counted_jobs} stage jobs (baseline: no-op jobs that defer their next "
                "hop) through a counting proxy between worker and server, every connection of "
                "the worker (pool, LISTEN, Django) included; per job"
            ),
            parameters={"jobs_per_repetition": sizes.counted_jobs},
            result=series([e["round_trips"] for e in counted["stage"]]),
            baseline_label=baseline_label,
            baseline=series([e["round_trips"] for e in counted["noop"]]),
            target=Target(on="figure", op="<=", value=5),
            profile={"counts": {"pgstage": stage_counts, "baseline": noop_counts}},
        )
    )
    rows.append(
        Row(
            key="inquiry_round_trips",
            scenario="round trips per inquiry (four stage jobs)",
            unit="round trips",
            measures=(
                f"{sizes.counted_inquiries} inquiries (baseline: 4-hop chains) through the "
                "counting proxy; per inquiry, all four stages"
            ),
            parameters={"inquiries_per_repetition": sizes.counted_inquiries},
            result=series([e["round_trips"] for e in counted["inquiry"]]),
            baseline_label="plain 4-hop chain",
            baseline=series([e["round_trips"] for e in counted["chain"]]),
            profile={"counts": {"pgstage": inquiry_counts, "baseline": chain_counts}},
        )
    )
    _explain(
        rows,
        stage_counts,
        noop_counts,
        inquiry_counts,
        chain_counts,
        work,
        per_job.get("c1", {}).get("noop_task"),
    )
    return rows


def _median_ms(entries: list[dict[str, float | None]]) -> dict[str, float | None]:
    """Per measure (wall, worker_cpu, server_cpu), the median over the repetitions."""
    found: dict[str, float | None] = {}
    for measure in ("wall", "worker_cpu", "server_cpu"):
        values = [e[measure] for e in entries if e.get(measure) is not None]
        found[measure] = round(percentile(values, 50), 3) if values else None
    return found


#: What each kind of batch is, in the cause texts.
KIND_LABELS = {
    "stage": "the stage job",
    "noop_task": "pgstage's no-op task",
    "noop": "the plain no-op",
    "noop_next": "the no-op that defers its next hop",
}


def _ms_text(kind: str, ms: dict[str, float | None]) -> str:
    server = (
        "server not on this machine"
        if ms["server_cpu"] is None
        else (f"{ms['server_cpu']:.2f} ms server CPU")
    )
    return (
        f"{KIND_LABELS[kind]} {ms['wall']:.2f} ms ({ms['worker_cpu']:.2f} ms worker CPU, {server})"
    )


def _cpu_cause(row: Row, per_job: dict[str, dict[str, float | None]], baseline: str) -> str:
    """Where a stage job's time goes against ``baseline``'s, per job, measured: wall time
    (1 / rate), the worker process's CPU (every thread) and its server sessions' CPU.
    At concurrency 1 a job's statements and its Python run in turn, so the wall times
    add up; the stage job is pgstage's no-op task plus its ledger work (claim, completion
    and the next hop's insert), and what the target leaves for that work is set against
    what that work costs the server alone."""
    if row.target is None or row.baseline is None or "stage" not in per_job:
        return ""
    stage, base = per_job["stage"], per_job[baseline]
    kinds = ["stage", "noop_task", baseline] if "noop_task" in per_job else ["stage", baseline]
    text = (
        "Per job, measured (medians; wall = 1 / rate, CPU as the kernel counts it: the "
        "worker process, every thread, and its sessions' server backends): "
        + "; ".join(_ms_text(kind, per_job[kind]) for kind in kinds)
        + "."
    )
    allowed = base["wall"] / row.target.value
    if row.parameters.get("concurrency") == 1 and "noop_task" in per_job:
        noop = per_job["noop_task"]
        left = allowed - noop["wall"]
        text += (
            f" The stage job is pgstage's no-op task plus its claim, its completion and the "
            f"next hop's insert: +{stage['wall'] - noop['wall']:.2f} ms a job"
        )
        if stage["server_cpu"] is not None and noop["server_cpu"] is not None:
            extra = stage["server_cpu"] - noop["server_cpu"]
            ledger = stage["wall"] - noop["wall"]
            text += (
                f", +{stage['worker_cpu'] - noop['worker_cpu']:.2f} ms of it the worker's "
                f"CPU and +{extra:.2f} ms the server's. The target allows {allowed:.2f} ms a "
                f"job; pgstage's no-op task takes {noop['wall']:.2f} ms, which leaves "
                f"{left:.2f} ms for the ledger's work"
            )
            text += f", less than its server CPU alone ({extra:.2f} ms)." if extra > left else "."
            if baseline == "noop":
                floor = base["wall"] + ledger
                text += (
                    f" Were pgstage's fetch and finish as cheap as procrastinate's (its whole "
                    f"no-op, {base['wall']:.2f} ms a job), the stage job would take "
                    f"{floor:.2f} ms (ratio {base['wall'] / floor:.2f}): its claim commits "
                    f"before its work (a round trip a no-op does not make) and its ledger "
                    f"writes cost the server {extra:.2f} ms, which a job that does nothing "
                    f"does not pay."
                )
        else:
            text += f"; the target allows {allowed:.2f} ms a job."
    elif stage["server_cpu"] is not None and base["server_cpu"] is not None:
        cpus = os.cpu_count() or 1
        spent = stage["worker_cpu"] + stage["server_cpu"]
        base_spent = base["worker_cpu"] + base["server_cpu"]
        busy = spent / (stage["wall"] * cpus)
        text += (
            f" Worker and server share the machine's {cpus} CPU(s): the stage job spends "
            f"{spent:.2f} ms of CPU a job, the baseline {base_spent:.2f} ms "
            f"({base_spent / spent:.2f}x as much; the rates' ratio is {row.ratio:.2f}); the "
            f"CPUs were {busy:.0%} busy with the stage batch. At {row.target.value:g}x the "
            f"baseline's rate on this machine's CPU a job would have to take at most "
            f"{base_spent / row.target.value:.2f} ms, and the stage job's server CPU alone "
            f"is {stage['server_cpu']:.2f} ms (the baseline's {base['server_cpu']:.2f} ms)."
        )
    return text


def _work_text(row: Row, work: dict[str, Any], noop: dict[str, float | None] | None) -> str:
    """The stages' own work set against what the target leaves for an inquiry."""
    if row.baseline is None or row.target is None:
        return ""
    inquiry = work["per_inquiry_ms"]
    stages = ", ".join(
        f"{stage} {ms['wall_p50']:g} ({ms['statements_p50']:g} in statements)"
        for stage, ms in work["per_stage_ms"].items()
    )
    submit = None
    if row.unit == "inquiries/s":
        chain_ms = 1000 / row.baseline.median
        budget = chain_ms / row.target.value
        what = f"A plain chain takes {chain_ms:.1f} ms at its measured rate"
    else:
        budget = row.baseline.median * row.target.value
        what = f"A plain chain's p50 is {row.baseline.median:.1f} ms"
        # The latency is timed from just before anfrage_submit (the chain's: its first
        # defer), which the batches' throughput leaves out (they are submitted at once).
        submit = work.get("submit_ms_p50")
    return (
        f"The four stages alone, run one after another in one process with no worker and "
        f"no queue, take {inquiry['wall_p50']:g} ms per inquiry (p50; "
        f"{inquiry['statements_p50']:g} ms of it in statements, the rest in the closing "
        f"transactions' COMMITs, which no statement wrapper sees, and in Python: storing "
        f"and reading the files, extracting, pricing, the lease's renewal thread); "
        f"per stage, ms: {stages}. {what}, so the target leaves {budget:.1f} ms per "
        f"inquiry for everything, the queue's fetch and finish of four jobs included"
        + (
            ": the stages' own work alone exceeds it, whatever the queue costs."
            if inquiry["wall_p50"] > budget
            else "."
        )
        + (_queue_text(inquiry["wall_p50"], budget, noop, submit) if noop else "")
    )


def _queue_text(
    work_ms: float, budget: float, noop: dict[str, float | None], submit: float | None
) -> str:
    """The stages' work plus four jobs' worth of pgstage's no-op task (its fetch, finish
    and task wrapper, measured in the concurrency-1 stage batches), and for the latency
    the submission too, against the budget."""
    queue = 4 * noop["wall"]
    total = work_ms + queue + (submit or 0.0)
    return (
        f" pgstage's worker takes {noop['wall']:.2f} ms a job for a task that does nothing "
        f"(its fetch, its finish and the task wrapper; the stage batches' no-op task), "
        f"{queue:.1f} ms for four"
        + (
            f"; anfrage_submit itself takes {submit:.2f} ms (p50, in this process: the "
            "upload stored, its audit, the intake job)"
            if submit is not None
            else ""
        )
        + f": with the stages' work, {total:.1f} ms an inquiry"
        + (
            ", over what the target leaves: the floor while each stage is a job of its own."
            if total > budget
            else f", {budget - total:.1f} ms under what the target leaves."
        )
    )


def _explain(
    rows, stage_counts, noop_counts, inquiry_counts, chain_counts, work, noop_task
) -> None:
    for row in rows:
        if row.met is not False:
            continue
        if row.key.startswith("stage_jobs") or row.key == "stage_round_trips":
            row.cause = (
                f"a stage job takes {counts_text(stage_counts)}; the no-op "
                f"{counts_text(noop_counts)}. The stage job's work statements: "
                f"{top_work(stage_counts, n=8)}"
            )
            per_job = row.profile.get("per_job_ms")
            if per_job:
                baseline = "noop" if row.key == "stage_jobs_c1_bare" else "noop_next"
                row.cause += ". " + _cpu_cause(row, per_job, baseline)
        elif row.key.startswith("inquir"):
            row.cause = (
                f"an inquiry's four stage jobs take {counts_text(inquiry_counts)}; the plain "
                f"chain {counts_text(chain_counts)}. {_work_text(row, work, noop_task)} The "
                f"most frequent work statements: {top_work(inquiry_counts, n=6)}"
            )
        elif row.key == "worker_peak_rss":
            row.cause = (
                f"pgstage's workers peak at {row.figure:.1f} MB against "
                f"{row.baseline.median:.1f} MB"
            )
