"""Operators' actions on analyses (the admin and the commands call these): requeue a lost
task, refund a finished job, retry a failed one (audited)."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from django.db import transaction

from runs.admission import analysis_job_admit, enqueue_process, lock_job
from runs.credits import credit_refund
from runs.exceptions import JobNotFound, RetryRefused
from runs.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    AnalysisAudit,
    AnalysisJob,
    AuditAction,
    CreditEntry,
    CreditKind,
    JobStatus,
)

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
    outcome: RetryOutcome
    job_id: int
    new_job_id: int | None = None
    status: str = ""
    queue_position: int = 0


def analysis_job_retry(*, job_id: int, actor: str, dry_run: bool = False) -> Retried:
    """Retry a failed analysis: admit its document and sources again as a new job of the
    same run, and record who did it in the analysis audit log.

    The failed job stays as it was (failed, its credit refunded); the new job is admitted
    like a click — every check again, one credit charged, ``pending`` or ``queued`` in
    the user's queue — so the user pays once for the analysis that succeeds, and the run
    ends up holding the newer job's result. Once per job: under the failed job's row lock
    the audit entry is looked up first, and its unique index backs it, so a repeat (or a
    concurrent retry) returns ``ALREADY_RETRIED`` with the job the first one made. Lock
    order is the job's row, then the user's queue lock, as in ``process_job``.

    Raises :class:`RetryRefused` for a job that is not failed or whose document was
    trimmed, :class:`JobNotFound` for a missing one, and admission's refusals
    (``InsufficientCredits``, the core's) as they are; a refusal writes nothing.
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
        if dry_run:
            return Retried(outcome=RetryOutcome.WOULD_RETRY, job_id=job.pk)
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
            },
        )
    logger.info("analysis job %s retried as job %s by %s", job_id, admitted.id, actor)
    return Retried(
        outcome=RetryOutcome.RETRIED,
        job_id=job_id,
        new_job_id=admitted.id,
        status=admitted.status,
        queue_position=admitted.queue_position,
    )
