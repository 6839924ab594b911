"""Processing: release the held core run, judge, finish; fail (refunded once) and hand the
slot on; the resume tick's safety nets for work whose task is gone.

Every step is a compare-and-set on the job's locked row, so a retried task, a second
worker or the resume tick never applies a transition twice.
"""

from __future__ import annotations

import datetime
import enum
import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from accounts.models import User
from queueing.enqueue import Policy, queueing_lock_prefix
from queueing.exceptions import RetryLater
from queueing.planner import rows_walking
from queueing.rows import replace_children
from runs import judge as judging
from runs.admission import analysis_job_cancel, enqueue_process, lock_job, promote_next
from runs.core import get_core, held_run_give_back, queries, released_run_fail
from runs.credits import credit_refund
from runs.exceptions import (
    CoreStateError,
    CoreUnavailable,
    JudgeError,
)
from runs.models import (
    ACTIVE_STATUSES,
    AnalysisJob,
    JobCitation,
    JobStatus,
)
from runs.queue import PROCESS_JOB_KEY

logger = logging.getLogger(__name__)


class ProcessOutcome(enum.StrEnum):
    SKIPPED = "skipped"
    COMPLETE = "complete"
    FAILED = "failed"
    GAVE_UP = "gave_up"
    CANCELLED = "cancelled"


def release_window() -> datetime.timedelta:
    return datetime.timedelta(seconds=int(settings.RELEASE_RETRY_WINDOW_SECONDS))


@dataclass(frozen=True, kw_only=True)
class Requeued:
    requeued: int
    abandoned: int


def max_requeues() -> int:
    return int(getattr(settings, "ANALYSIS_MAX_REQUEUES", 3))


def analysis_jobs_requeue_lost(*, idle_seconds: int, limit: int = 500) -> Requeued:
    """Enqueue ``process_job`` again for active jobs idle for ``idle_seconds`` whose task
    is gone (deleted, or lost in a way nothing else noticed). The EXCLUSIVE key makes this
    a no-op for every job whose task still waits, retries or runs. Bounded: a job whose
    task was lost ``ANALYSIS_MAX_REQUEUES`` times fails (refunded once, the user's next
    job starts), so nothing holds a user's queue for ever."""
    cutoff = timezone.now() - datetime.timedelta(seconds=idle_seconds)
    # Only jobs whose task is gone are read (one probe of the EXCLUSIVE key's index each):
    # however many older jobs are merely slow, a lost one is found.
    rows = rows_walking(
        queries["lost_process_jobs"],
        {
            "cutoff": cutoff,
            "lock_prefix": queueing_lock_prefix(PROCESS_JOB_KEY, Policy.EXCLUSIVE),
            "limit": limit,
        },
    )
    lost = [row["id"] for row in rows]
    outcomes = [_requeue_lost(job_id, cutoff=cutoff) for job_id in lost]
    return Requeued(requeued=outcomes.count("requeued"), abandoned=outcomes.count("abandoned"))


def _requeue_lost(job_id: int, *, cutoff: datetime.datetime) -> str | None:
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.status not in ACTIVE_STATUSES or job.updated_at >= cutoff:
            return None
        before = transaction.savepoint()
        if not enqueue_process(job.pk, tenant_id=job.tenant_id).created:
            return None  # its task still waits, retries or runs
        if job.requeues >= max_requeues():
            transaction.savepoint_rollback(before)
            job_fail(
                job,
                reason=f"its task was lost {job.requeues + 1} times (ANALYSIS_MAX_REQUEUES="
                f"{max_requeues()}); the credit was refunded",
            )
            return "abandoned"
        AnalysisJob.objects.filter(pk=job.pk).update(requeues=F("requeues") + 1)
    return "requeued"


def analysis_job_abandon(*, job_id: int, reason: str, tenant: str = "") -> bool:
    """``process_job``'s give-up hook: its job ended for good without finishing the
    analysis (its last attempt failed, its workers kept dying, an operator cancelled
    it). Fail the analysis, refund it once, start the user's next job. Compare-and-set on
    the locked row: False when the analysis is not active any more."""
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.status not in ACTIVE_STATUSES:
            return False
        job_fail(job, reason=f"the analysis could not be completed: {reason}")
    return True


def job_fail(job: AnalysisJob, *, reason: str) -> None:
    """Mark the (locked) job failed, refund it once, give its held core run back when it
    was never released (the provider did no work) or fail it when it was, and hand its
    slot on."""
    now = timezone.now()
    AnalysisJob.objects.filter(pk=job.pk).update(
        status=JobStatus.FAILED, error=reason, finished_at=now, updated_at=now
    )
    credit_refund(job, note=f"analysis job {job.pk} failed")
    # The user's lock before the tenant's budget row (the give-back's), the order the
    # admission takes them in: the other order deadlocks with an admit of this user.
    if not job.is_delta:
        promote_next(job.user_id, tenant_id=job.tenant_id)
    if job.released_at is None:
        held_run_give_back(core_run_id=job.core_run_id)
    else:
        released_run_fail(core_run_id=job.core_run_id, detail=reason)


def _release_failed_reason(job: AnalysisJob, exc: Exception) -> str:
    minutes = int(release_window().total_seconds() // 60)
    return (
        f"the core service stayed unreachable for the whole {minutes}-minute release window "
        f"({job.release_attempts} attempts; last error: {exc}); the credit was refunded"
    )


def analysis_job_process(*, job_id: int) -> ProcessOutcome:
    """Run one analysis: mark it running, release its held core run, judge its citations,
    write verdicts and results, mark it complete, and promote the user's next job.

    Idempotent and retry-safe: each step is a compare-and-set on the locked job row, a
    job that is not active is skipped, and a release that already happened is not
    repeated. While the core is unreachable it raises :class:`RetryLater` bounded by the
    job's ``release_deadline`` (set at the first attempt); past it the job fails and its
    credit is refunded exactly once.
    """
    core = get_core()
    retry_until = None
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.status not in ACTIVE_STATUSES:
            return ProcessOutcome.SKIPPED
        if job.released_at is None and not _user_is_active(job.user_id):
            _cancel_deactivated(job)
            return ProcessOutcome.CANCELLED
        now = timezone.now()
        if job.status == JobStatus.PENDING:
            job.status, job.started_at = JobStatus.RUNNING, now
        if job.released_at is None:
            if job.release_deadline is None:
                job.release_deadline = now + release_window()
            job.release_attempts += 1
            try:
                core.release(core_run_id=job.core_run_id)
                core.start(core_run_id=job.core_run_id)
                job.released_at = now
            except CoreUnavailable as exc:
                if now >= job.release_deadline:
                    _save_attempt(job, now)
                    job_fail(job, reason=_release_failed_reason(job, exc))
                    return ProcessOutcome.GAVE_UP
                retry_until = job.release_deadline
            except CoreStateError as exc:
                # The core will never release this run (an operator closed it): final.
                _save_attempt(job, now)
                job_fail(job, reason=f"the core refused to release the run: {exc}")
                return ProcessOutcome.FAILED
        _save_attempt(job, now)
    if retry_until is not None:
        raise RetryLater(
            f"core unreachable releasing analysis job {job_id}; retrying until {retry_until}",
            deadline=retry_until,
        )

    # Judge outside any transaction: a slow (remote) judge must not hold the row lock.
    doc_html, sources = AnalysisJob.objects.values_list("doc_html", "sources").get(pk=job_id)
    judge = judging.get_judge()
    try:
        verdicts = judging.judge_document(doc_html=doc_html or "", sources=sources, judge=judge)
    except JudgeError as exc:
        with transaction.atomic():
            job = lock_job(job_id)
            if job is None or job.status != JobStatus.RUNNING:
                return ProcessOutcome.SKIPPED
            _finish_core(core, job, ok=False, detail=str(exc))
            job_fail(job, reason=f"the judge could not judge this document: {exc}")
        return ProcessOutcome.FAILED

    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.status != JobStatus.RUNNING:
            return ProcessOutcome.SKIPPED
        _finish_core(core, job, ok=True)
        replace_children(
            JobCitation,
            parent={"job_id": job.pk},
            rows=[
                JobCitation(
                    marker=v.marker,
                    source_key=v.source_key,
                    claim=v.claim,
                    verdict=v.verdict,
                    score=v.score,
                )
                for v in verdicts
            ],
        )
        items = [v.as_json() for v in verdicts]
        now = timezone.now()
        AnalysisJob.objects.filter(pk=job.pk).update(
            status=JobStatus.COMPLETE,
            results={"judge": judge.name, "verdicts": items, "summary": judging.summarize(items)},
            error="",
            finished_at=now,
            updated_at=now,
        )
        if not job.is_delta:
            promote_next(job.user_id, tenant_id=job.tenant_id)
    return ProcessOutcome.COMPLETE


DEACTIVATED_REASON = "its user was deactivated before it started; the credit was refunded"


def _user_is_active(user_id: int) -> bool:
    return User.objects.filter(pk=user_id, is_active=True).exists()


def _cancel_deactivated(job: AnalysisJob) -> None:
    """Cancel the (locked, unreleased) job of a deactivated user: refunded once, its held
    core run given back; then the user's queued jobs, which would start next."""
    now = timezone.now()
    AnalysisJob.objects.filter(pk=job.pk).update(
        status=JobStatus.CANCELLED, error=DEACTIVATED_REASON, finished_at=now, updated_at=now
    )
    credit_refund(job, note=f"analysis job {job.pk} cancelled: its user was deactivated")
    # The user's lock (each queued job's cancel) before the tenant's budget row.
    analysis_jobs_cancel_deactivated(user_id=job.user_id)
    held_run_give_back(core_run_id=job.core_run_id)


def analysis_jobs_cancel_deactivated(*, user_id: int | None = None, limit: int = 500) -> int:
    """Cancel the queued jobs of deactivated users (of ``user_id`` only, when given):
    each refunded once and its held core run given back, so a deactivated user's queue
    never starts and never spends the tenant's budget. Each cancel takes the user's queue
    lock and re-checks the job is still queued, so a stale list is harmless; pending and
    running jobs are cancelled by their own ``process_job`` before their release (a
    released one finishes: the provider is already at work). Returns how many."""
    queued = AnalysisJob.objects.filter(
        status=JobStatus.QUEUED, deleted_at__isnull=True, user__is_active=False
    )
    if user_id is not None:
        queued = queued.filter(user_id=user_id)
    ids = list(queued.order_by("id").values_list("pk", flat=True)[:limit])
    return sum(analysis_job_cancel(job_id=pk, reason=DEACTIVATED_REASON) for pk in ids)


def _save_attempt(job: AnalysisJob, now: datetime.datetime) -> None:
    job.updated_at = now
    job.save(
        update_fields=[
            "status",
            "started_at",
            "release_deadline",
            "release_attempts",
            "released_at",
            "updated_at",
        ]
    )


def _finish_core(core, job: AnalysisJob, *, ok: bool, detail: str = "") -> None:
    try:
        core.finish(core_run_id=job.core_run_id, ok=ok, detail=detail)
    except CoreUnavailable as exc:
        # Nothing of this attempt is committed; the verdicts are recomputed next time.
        raise RetryLater(f"core unreachable closing analysis job {job.pk}") from exc


def analysis_job_give_up(*, job_id: int, skip_locked: bool = False) -> bool:
    """Fail a running job whose release window closed without a release, refunding its
    credit once (the resume tick's safety net for a retry that never came back).
    Compare-and-set on the locked row: False when the job moved on meanwhile, or (with
    ``skip_locked``) when another transaction holds the row."""
    with transaction.atomic():
        job = lock_job(job_id, skip_locked=skip_locked)
        if (
            job is None
            or job.status != JobStatus.RUNNING
            or job.released_at is not None
            or job.release_deadline is None
            or job.release_deadline > timezone.now()
        ):
            return False
        job_fail(job, reason=_release_failed_reason(job, CoreUnavailable()))
    return True
