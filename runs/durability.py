"""Row durability: the client save, the backstop sweep's record, the judge of each recorded
run version, and the trim of old bodies (never one whose run is missing).

Both writers go through one precedence UPSERT (``runs.sql``: ``record_run``), and recording
enqueues the run's judge job in the same transaction: no run is recorded but not judged.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from accounts.models import User
from queueing.enqueue import Policy, enqueue
from queueing.rows import insert_or_get
from runs import judge as judging
from runs.core import queries
from runs.exceptions import (
    JobNotFinished,
    NothingToSave,
)
from runs.models import (
    RECORDABLE_STATUSES,
    AnalysisJob,
    AnalysisRun,
    JobStatus,
    RunJudgement,
    SavedBy,
)
from runs.queue import (
    JUDGE_RUN_KEY,
    JUDGE_RUN_TASK,
    RUNS_QUEUE,
)
from runs.selectors import analysis_job_for_user, tenant_slug

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Recorded:
    run_id: uuid.UUID | None
    version: int | None
    written: bool


@dataclass(frozen=True, kw_only=True)
class Saved:
    run: AnalysisRun
    written: bool


@dataclass(frozen=True, kw_only=True)
class Trimmed:
    trimmed: int
    kept_unsaved: tuple[int, ...]


def analysis_run_record(*, job_id: int, saved_by: SavedBy) -> Recorded:
    """Record the job's run with the precedence UPSERT (``runs.sql``: ``record_run``) and,
    when it wrote, enqueue the run's judge job in the same transaction — so no run is
    ever recorded but not judged. Idempotent: a repeat writes nothing.

    Takes the job's row lock first (a no-op for the sweep, which holds it): a writer
    must never hold an uncommitted run row while it waits for the job row, or it would
    deadlock with a sweep that holds the job FOR UPDATE (which blocks the run's foreign
    key check) and waits for that run row.
    """
    with transaction.atomic():
        AnalysisJob.objects.select_for_update(no_key=True).filter(pk=job_id).values_list(
            "pk", flat=True
        ).first()
        with connection.cursor() as cursor:
            cursor.execute(queries["record_run"], {"job_id": job_id, "saved_by": saved_by.value})
            row = cursor.fetchone()
        if row is None:
            return Recorded(run_id=None, version=None, written=False)
        run_id, version, tenant_id = row
        enqueue(
            JUDGE_RUN_TASK,
            # The tenant only names it in the job's log lines.
            args={"run_id": str(run_id), "version": version, "tenant": tenant_slug(tenant_id)},
            key=JUDGE_RUN_KEY.build(run=run_id, version=version),
            policy=Policy.EXCLUSIVE,
            queue=RUNS_QUEUE,
        )
    return Recorded(run_id=run_id, version=version, written=True)


def analysis_run_save(*, user: User, job_id: int) -> Saved:
    """The client save (the browser saw its job terminal). ``written`` is False when the
    run already holds this save, or a later job of the run: a repeat, or a stale save of
    a job that a delta re-check superseded, rewrites nothing (the run keeps its newest)."""
    job = analysis_job_for_user(user=user, job_id=job_id)
    if job.status not in RECORDABLE_STATUSES:
        if job.status == JobStatus.CANCELLED:
            raise NothingToSave("the analysis was cancelled; there is nothing to save")
        raise JobNotFinished(f"job {job.pk} is {job.status}; save its run once it is complete")
    recorded = analysis_run_record(job_id=job.pk, saved_by=SavedBy.CLIENT)
    run = AnalysisRun.objects.defer("doc_html").filter(pk=job.run_id).first()
    if run is None:
        raise NothingToSave()
    return Saved(run=run, written=recorded.written)


def analysis_run_judge(*, run_id: uuid.UUID, version: int) -> str:
    """Judge (and diagnose) one recorded run version, once: the unique (run, version)
    makes a repeat a no-op. A version that was overwritten meanwhile is left to the
    judge job of its successor."""
    run = (
        AnalysisRun.objects.filter(pk=run_id)
        .values("version", "results", "saved_by", "job_id")
        .first()
    )
    if run is None:
        return "missing"
    if run["version"] != version:
        return "superseded"
    results = run["results"] or {}
    summary = {
        "judge": results.get("judge"),
        "verdicts": judging.summarize(results.get("verdicts") or []),
        "saved_by": run["saved_by"],
        "job_id": run["job_id"],
    }
    _, created = insert_or_get(
        RunJudgement,
        values={"run": run_id, "version": version, "summary": summary, "judged_at": timezone.now()},
        conflict_fields=("run", "version"),
    )
    return "judged" if created else "already_judged"


def doc_html_trim(*, hours: int, limit: int = 500) -> Trimmed:
    """Clear the body of jobs that ended more than ``hours`` ago, never from a job that
    still lacks its run (those are logged and counted). One bounded statement with
    SKIP LOCKED, so it never waits on (or races) the backstop sweep."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries["trim_doc_html"], {"hours": hours, "limit": limit})
        trimmed = len(cursor.fetchall())
    with connection.cursor() as cursor:
        cursor.execute(queries["untrimmable_unsaved"], {"hours": hours, "limit": limit})
        kept = tuple(row[0] for row in cursor.fetchall())
    if kept:
        logger.warning(
            "doc_html trim kept the body of %d ended job(s) that still lack their run "
            "(the unsaved_runs sweep should record them): %s",
            len(kept),
            ", ".join(map(str, kept[:20])),
        )
    return Trimmed(trimmed=trimmed, kept_unsaved=kept)
