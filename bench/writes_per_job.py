"""Tuple writes on ``analysis_runs`` per finished job: the backstop design against the
eager two-writer design it replaced.

Scenario (invariant 6, docs/design.md#invariants): N finished jobs; a browser saves a
share of them in time (``POST /api/analysis-runs``, here the same service), the grace period passes
(rows back-dated), and the ``unsaved_runs`` sweep records the rest; then every enqueued
judge job runs. Writes are PostgreSQL's own counters, ``pg_stat_user_tables.n_tup_ins +
n_tup_upd`` for ``analysis_runs``, read before and after each phase. The eager design
(the worker writes the run at finalize, then the browser's save rewrites it) is measured
the same way on a second set of jobs.

The counters are table-wide: run it on a database nobody else is writing runs to.
Its rows are deleted afterwards unless ``--keep``.

Run: ``DJANGO_SETTINGS_MODULE=config.settings python -m bench.writes_per_job
[--jobs 1000] [--client-share 0.95] [--keep]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
import uuid

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

#: A body the size of a short chapter, so the rows carry TOASTed text as in production.
BODY = "<p>" + "Water boils at one hundred degrees at sea level [thermo]. " * 200 + "</p>"
RESULTS = {
    "judge": "overlap-v1",
    "verdicts": [
        {
            "marker": "c1",
            "source_key": "thermo",
            "claim": "Water boils.",
            "verdict": "supported",
            "score": 1.0,
            "reason": "",
        }
    ],
    "summary": {"citations": 1, "supported": 1},
}


def _run_writes() -> int:
    """n_tup_ins + n_tup_upd of analysis_runs, after flushing this backend's counters."""
    from django.db import connection
    from psycopg import errors

    with connection.cursor() as cursor:
        try:
            # PostgreSQL 15+: counters reach the shared stats when the backend goes idle.
            cursor.execute("SELECT pg_stat_force_next_flush()")
        except errors.UndefinedFunction:
            time.sleep(1.0)  # older servers: the stats collector's reporting delay
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_tup_ins + n_tup_upd FROM pg_stat_user_tables WHERE relname = %s",
            ["analysis_runs"],
        )
        return int(cursor.fetchone()[0])


def _create_jobs(user, count: int) -> list:
    from django.utils import timezone

    from runs.models import AnalysisJob, JobStatus

    now = timezone.now()
    return AnalysisJob.objects.bulk_create(
        AnalysisJob(
            tenant_id=user.tenant_id,
            user=user,
            run_id=uuid.uuid4(),
            status=JobStatus.COMPLETE,
            title=f"bench {i}",
            doc_html=BODY,
            sources=[{"key": "thermo"}],
            results=RESULTS,
            finished_at=now,
        )
        for i in range(count)
    )


def _past_grace(jobs: list) -> None:
    from django.conf import settings
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE analysis_jobs SET updated_at = updated_at - %s * interval '1 second' "
            "WHERE id = ANY(%s)",
            [settings.SWEEP_GRACE_SECONDS + 1, [j.pk for j in jobs]],
        )


def _judge_all(run_ids: list[str]) -> None:
    from django.db import connection

    from runs import durability
    from runs.queue import JUDGE_RUN_TASK

    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM procrastinate_jobs WHERE task_name = %s AND status = 'todo' "
            "AND args->>'run_id' = ANY(%s) RETURNING args->>'run_id', (args->>'version')::int",
            [JUDGE_RUN_TASK, run_ids],
        )
        enqueued = cursor.fetchall()
    for run_id, version in enqueued:
        durability.analysis_run_judge(run_id=uuid.UUID(run_id), version=version)


def _backstop(user, jobs: list, client_share: float) -> dict[str, int]:
    """The shipped design: client saves in time, the sweep records the rest."""
    from queueing.sweeps import run_sweep
    from runs import durability

    saved = jobs[: round(len(jobs) * client_share)]
    counts = {"start": _run_writes()}
    for job in saved:
        durability.analysis_run_save(user=user, job_id=job.pk)
    counts["client"] = _run_writes()
    _past_grace(jobs)
    while run_sweep("unsaved_runs").selected:
        pass
    run_sweep("unsaved_runs")  # one more tick over a settled table writes nothing
    counts["sweep"] = _run_writes()
    _judge_all([str(j.run_id) for j in jobs])
    counts["judge"] = _run_writes()
    return counts


def _eager(user, jobs: list, client_share: float) -> dict[str, int]:
    """The replaced design: the worker writes every run at finalize, the browser's save
    then rewrites it (client beats worker)."""
    from runs import durability
    from runs.models import SavedBy

    counts = {"start": _run_writes()}
    for job in jobs:
        durability.analysis_run_record(job_id=job.pk, saved_by=SavedBy.WORKER)
    counts["worker"] = _run_writes()
    for job in jobs[: round(len(jobs) * client_share)]:
        durability.analysis_run_save(user=user, job_id=job.pk)
    counts["client"] = _run_writes()
    _judge_all([str(j.run_id) for j in jobs])
    counts["judge"] = _run_writes()
    return counts


def _cleanup(tenant, user) -> None:
    from django.db import connection, transaction

    from runs.models import AnalysisJob, AnalysisRun, RunJudgement

    with transaction.atomic():
        run_ids = list(AnalysisRun.objects.filter(user=user).values_list("pk", flat=True))
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM procrastinate_jobs WHERE args->>'run_id' = ANY(%s)",
                [[str(r) for r in run_ids]],
            )
        RunJudgement.objects.filter(run_id__in=run_ids).delete()
        AnalysisRun.objects.filter(user=user).delete()
        AnalysisJob.objects.filter(user=user).delete()
        user.delete()
        tenant.delete()


def _row(name: str, counts: dict[str, int], jobs: int) -> list[object]:
    phases = list(counts)
    deltas = {b: counts[b] - counts[a] for a, b in itertools.pairwise(phases)}
    total = counts[phases[-1]] - counts["start"]
    detail = ", ".join(f"{phase} {delta}" for phase, delta in deltas.items())
    return [name, jobs, total, f"{total / jobs:.3f}", detail]


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Run the scenario (Django must be set up) and print a table; returns writes/job."""
    from accounts.services import tenant_get_or_create, user_get_or_create
    from queueing.display import format_table

    parser = argparse.ArgumentParser(
        prog="python -m bench.writes_per_job", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument(
        "--client-share",
        type=float,
        default=0.95,
        help="share of jobs whose browser saves the run in time",
    )
    parser.add_argument("--keep", action="store_true", help="keep the bench's rows")
    args = parser.parse_args(argv)
    if args.jobs < 1 or not 0.0 <= args.client_share <= 1.0:
        parser.error("--jobs must be >= 1 and --client-share within [0, 1]")

    tag = uuid.uuid4().hex[:8]
    tenant = tenant_get_or_create(slug=f"bench-writes-{tag}")
    user = user_get_or_create(tenant=tenant, username=f"bench-writes-{tag}")
    try:
        backstop = _backstop(user, _create_jobs(user, args.jobs), args.client_share)
        eager = _eager(user, _create_jobs(user, args.jobs), args.client_share)
    finally:
        if not args.keep:
            _cleanup(tenant, user)

    rows = [
        _row("backstop (shipped)", backstop, args.jobs),
        _row("eager worker + client", eager, args.jobs),
    ]
    print(
        f"analysis_runs tuple writes (n_tup_ins + n_tup_upd), {args.jobs} jobs, "
        f"{args.client_share:.0%} saved by the client in time"
    )
    print(format_table(["design", "jobs", "writes", "writes/job", "by phase"], rows))
    return {"backstop": float(rows[0][3]), "eager": float(rows[1][3])}


if __name__ == "__main__":
    import django

    django.setup()
    main()
