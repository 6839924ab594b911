"""Operators' actions on analyses (the admin and the commands call these): requeue a lost
task, refund a finished job, retry a failed one (audited)."""

from __future__ import annotations

import enum
import logging
import uuid
from dataclasses import dataclass

from django.db import transaction

from queueing import locks
from runs.admission import analysis_job_admit, enqueue_process, lock_job
from runs.credits import credit_refund
from runs.exceptions import JobNotFound, RetryRefused, UserInactive
from runs.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    AnalysisAudit,
    AnalysisJob,
    AnalysisRun,
    AuditAction,
    CreditEntry,
    CreditKind,
    JobStatus,
)
from runs.queue import ANALYSIS_QUEUE_LOCK

logger = logging.getLogger(__name__)


class RequeueOutcome(enum.StrEnum):
    ENQUEUED = "enqueued"
    ALREADY_WAITING = "already_waiting"
    NOT_ACTIVE = "not_active"


class RefundOutcome(enum.StrEnum):
    REFUNDED = "refunded"
    ALREADY_REFUNDED = "already_refunded"
    NOT_FINISHED = "not_finished"
    NOT_CHARGED = "not_charged"
    MISSING = "missing"


def analysis_job_requeue(*, job_id: int) -> RequeueOutcome:
    """Enqueue a pending or running job's ``process_job`` again (an operator's retry of a
    job whose task failed for good or was lost with its worker).

    A queued job waits for its promotion and a terminal job is final: both are
    ``NOT_ACTIVE`` and nothing is enqueued. Under the job's row lock, so the check cannot
    race the job's own move to a terminal status; the EXCLUSIVE key makes a requeue a
    no-op (``ALREADY_WAITING``) while the job's task waits, retries or runs.
    """
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None or job.status not in ACTIVE_STATUSES:
            return RequeueOutcome.NOT_ACTIVE
        enqueued = enqueue_process(job.pk, tenant_id=job.tenant_id)
    return RequeueOutcome.ENQUEUED if enqueued.created else RequeueOutcome.ALREADY_WAITING


def analysis_job_refund(*, job_id: int, note: str = "") -> RefundOutcome:
    """Give a finished job's credit back (an operator's refund, e.g. for a poor result).

    Exactly once: the credit ledger's unique (job, kind) turns a repeat, and a refund the
    job already got when it failed or was cancelled, into ``ALREADY_REFUNDED``. Only a
    terminal job that was charged is refunded, so a refund never precedes the job's own
    (failure or cancellation) refund nor gives back what was never charged. Under the
    job's row lock, the lock every transition of a job takes; not under the user's queue
    lock, which ``process_job`` takes while it holds the row (the reverse order could
    deadlock with a job that is finishing).
    """
    with transaction.atomic():
        job = lock_job(job_id)
        if job is None:
            return RefundOutcome.MISSING
        if job.status not in TERMINAL_STATUSES:
            return RefundOutcome.NOT_FINISHED
        if not CreditEntry.objects.filter(job_id=job.pk, kind=CreditKind.CHARGE).exists():
            return RefundOutcome.NOT_CHARGED
        created = credit_refund(job, note=note or f"analysis job {job.pk} refunded")
    return RefundOutcome.REFUNDED if created else RefundOutcome.ALREADY_REFUNDED


class RetryOutcome(enum.StrEnum):
    RETRIED = "retried"
    WOULD_RETRY = "would_retry"
    ALREADY_RETRIED = "already_retried"


@dataclass(frozen=True, kw_only=True)
class Retried:
    """What a retry did (or, dry, would do). ``run_job_id`` and ``run_saved_by`` name
    what the run held when the retry was decided: the result the new job replaces once it
    finishes and is saved (``None``: the run has no saved result yet)."""

    outcome: RetryOutcome
    job_id: int
    new_job_id: int | None = None
    status: str = ""
    queue_position: int = 0
    run_id: uuid.UUID | None = None
    run_job_id: int | None = None
    run_saved_by: str | None = None

    @property
    def replaces(self) -> str:
        """For operators: what the retry's result replaces in the user's run."""
        if self.run_id is None:
            return ""
        if self.run_job_id is None and self.run_saved_by is None:
            return f"run {self.run_id} has no saved result yet"
        held = f"job {self.run_job_id}" if self.run_job_id is not None else "a legacy row"
        return f"replaces run {self.run_id}'s {held} (saved by {self.run_saved_by or 'client'})"


def analysis_job_retry(*, job_id: int, actor: str, dry_run: bool = False) -> Retried:
    """Retry a failed analysis: admit its document and sources again as a new job of the
    same run, and record who did it in the analysis audit log.

    Only the run's newest intent is retried: a failed job that a later job of its run
    superseded (a delta re-check the user made since, whatever became of it) is refused
    with :class:`RetryRefused` naming that job, because the retry would get a newer job
    id than the user's latest and, by the run's newest-job-wins rule, replace the user's
    newer result with the older document. The check runs under the user's queue lock,
    which every admission of the user takes, and the retry's own admission joins it: no
    delta can slip in between the check and the new job.

    The failed job stays as it was (failed, its credit refunded); the new job is admitted
    like a click — every check again, one credit charged, ``pending`` or ``queued`` in
    the user's queue — so the user pays once for the analysis that succeeds, and the run
    ends up holding the newer job's result. The outcome (also dry) names what the run
    holds now, the result the new job will replace. Once per job: under the failed job's
    row lock the audit entry is looked up first, and its unique index backs it, so a
    repeat (or a concurrent retry) returns ``ALREADY_RETRIED`` with the job the first one
    made. Lock order is the job's row, then the user's queue lock, as in ``process_job``.

    Raises :class:`RetryRefused` for a job that is not failed, was superseded or whose
    document was trimmed, :class:`JobNotFound` for a missing one, and admission's
    refusals (``UserInactive``, ``InsufficientCredits``, the core's) as they are; a
    refusal writes nothing.
    """
    with transaction.atomic():
        job = (
            AnalysisJob.objects.select_for_update(of=("self",))
            .select_related("user")
            .filter(pk=job_id, deleted_at__isnull=True)
            .first()
        )
        if job is None:
            raise JobNotFound(f"no analysis job {job_id}")
        previous = AnalysisAudit.objects.filter(job_id=job.pk, action=AuditAction.RETRY).first()
        if previous is not None:
            return Retried(
                outcome=RetryOutcome.ALREADY_RETRIED,
                job_id=job.pk,
                new_job_id=previous.payload.get("new_job_id"),
            )
        if job.status != JobStatus.FAILED:
            raise RetryRefused(f"job {job.pk} is {job.status}; only failed analyses are retried")
        if job.doc_html is None:
            raise RetryRefused(
                f"job {job.pk}'s document was trimmed after it ended; the user must submit it again"
            )
        if not job.user.is_active:
            raise UserInactive(f"job {job.pk}'s user is deactivated; it is not retried")
        locks.xact_lock(ANALYSIS_QUEUE_LOCK, job.user_id)
        _refuse_superseded(job)
        run = AnalysisRun.objects.filter(pk=job.run_id).values_list("job_id", "saved_by").first()
        held = {
            "run_id": job.run_id,
            "run_job_id": run[0] if run else None,
            "run_saved_by": run[1] if run else None,
        }
        if dry_run:
            return Retried(outcome=RetryOutcome.WOULD_RETRY, job_id=job.pk, **held)
        admitted = analysis_job_admit(
            user=job.user,
            title=job.title,
            doc_html=job.doc_html,
            sources=job.sources,
            delta_of_job_id=job.delta_of_job_id,
            run_id=job.run_id,
        )
        AnalysisAudit.objects.create(
            tenant_id=job.tenant_id,
            job=job,
            action=AuditAction.RETRY,
            actor=actor[:150],
            payload={
                "new_job_id": admitted.id,
                "new_status": admitted.status,
                "error": job.error,
                "replaced_job_id": held["run_job_id"],
            },
        )
    logger.info("analysis job %s retried as job %s by %s", job_id, admitted.id, actor)
    return Retried(
        outcome=RetryOutcome.RETRIED,
        job_id=job_id,
        new_job_id=admitted.id,
        status=admitted.status,
        queue_position=admitted.queue_position,
        **held,
    )


def _refuse_superseded(job: AnalysisJob) -> None:
    """Refuse the retry of a job that is no longer its run's newest (under the user's
    queue lock, so no admission of the user adds a later job meanwhile)."""
    later = (
        AnalysisJob.objects.filter(run_id=job.run_id, pk__gt=job.pk, deleted_at__isnull=True)
        .order_by("-pk")
        .values_list("pk", "status")
        .first()
    )
    if later is not None:
        raise RetryRefused(
            f"job {job.pk} was superseded by job {later[0]} ({later[1]}) of the same run; a "
            "retry would replace the user's newer result with this older document"
        )
