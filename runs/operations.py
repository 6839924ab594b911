"""Operators' actions on analyses (the admin and the commands call these)."""

from __future__ import annotations

import enum
import logging

from django.db import transaction

from runs.admission import enqueue_process, lock_job
from runs.credits import credit_refund
from runs.models import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    CreditEntry,
    CreditKind,
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
        enqueued = enqueue_process(job.pk)
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
