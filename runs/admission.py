"""Admission and the per-user queue: admit with every check at click time, promote the
oldest queued job when the slot frees, cancel a queued job.

The per-user queue lock (``runs.queue.ANALYSIS_QUEUE_LOCK``) serialises admission,
promotion and cancellation of one user's jobs; promotion enqueues the job's
``process_job`` in the same transaction, so a started job always has its task.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from queueing import locks
from queueing.enqueue import Enqueued, Policy, enqueue
from runs import judge as judging
from runs.core import get_core
from runs.credits import ANALYSIS_PRICE, credit_refund
from runs.exceptions import (
    InsufficientCredits,
    NoCitations,
    ParentNotComplete,
    QueueFull,
    TooManyCitations,
)
from runs.models import (
    ACTIVE_STATUSES,
    AnalysisJob,
    CreditEntry,
    CreditKind,
    JobStatus,
)
from runs.queue import (
    ANALYSIS_QUEUE,
    ANALYSIS_QUEUE_LOCK,
    PROCESS_JOB_KEY,
    PROCESS_JOB_TASK,
    RUNS_QUEUE,
)
from runs.selectors import analysis_job_for_user, credit_balance, queue_position

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Admission:
    id: int
    run_id: uuid.UUID
    status: str
    queue_position: int


def enqueue_process(job_id: int) -> Enqueued:
    return enqueue(
        PROCESS_JOB_TASK,
        args={"job_id": job_id},
        key=PROCESS_JOB_KEY.build(job=job_id),
        policy=Policy.EXCLUSIVE,
        queue=RUNS_QUEUE,
    )


def lock_job(job_id: int) -> AnalysisJob | None:
    return (
        AnalysisJob.objects.select_for_update()
        .defer("doc_html")
        .filter(pk=job_id, deleted_at__isnull=True)
        .first()
    )


def analysis_job_admit(
    *,
    user: User,
    title: str,
    doc_html: str,
    sources: Sequence[Mapping[str, object]],
    delta_of_job_id: int | None = None,
    run_id: uuid.UUID | None = None,
) -> Admission:
    """Run every synchronous check, then admit the job ``pending`` (slot free) or
    ``queued``; delta re-checks are always ``pending``. The job produces a new run, its
    parent's (a delta), or ``run_id`` (an operator's retry of a job of that run).

    One transaction under the user's queue lock: the bound on open jobs, the balance
    check, the held core run (which takes a unit of the tenant's daily budget), the job
    row, the charge and (when ``pending``) its ``process_job`` commit together, so a
    refused admission charges nothing and leaves no row, and two concurrent admits of one
    user can neither both take the slot, nor pass the bound, nor overdraw the balance.
    """
    citations = judging.extract_citations(doc_html)
    if not citations:
        raise NoCitations()
    if len(citations) > judging.MAX_CITATIONS:
        raise TooManyCitations(
            f"the document holds {len(citations)} citations; at most {judging.MAX_CITATIONS} "
            "per analysis"
        )
    core = get_core()
    with transaction.atomic():
        locks.xact_lock(ANALYSIS_QUEUE_LOCK, user.pk)
        _check_open_jobs(user)
        parent = None
        if delta_of_job_id is not None:
            parent = analysis_job_for_user(user=user, job_id=delta_of_job_id)
            if parent.status != JobStatus.COMPLETE:
                raise ParentNotComplete(
                    f"job {parent.pk} is {parent.status}; a delta re-check needs a "
                    "complete analysis"
                )
        balance = credit_balance(user_id=user.pk)
        if balance < ANALYSIS_PRICE:
            raise InsufficientCredits(
                f"the balance is {balance} credit(s) and an analysis costs {ANALYSIS_PRICE}; "
                "ask an operator to run manage.py grant_credits"
            )
        run_id = parent.run_id if parent else run_id or uuid.uuid4()
        core_run_id = core.create_held(run_id=run_id, user_id=user.pk, sources=sources)
        admitted = ANALYSIS_QUEUE.admit(
            key=user.pk,
            values={
                "tenant": user.tenant_id,
                "run_id": run_id,
                "delta_of_job": parent.pk if parent else None,
                "title": title,
                "doc_html": doc_html,
                "sources": [dict(s) for s in sources],
                "error": "",
                "core_run": core_run_id,
                "release_attempts": 0,
            },
        )
        CreditEntry.objects.create(
            user_id=user.pk,
            job_id=admitted.id,
            kind=CreditKind.CHARGE,
            amount=-ANALYSIS_PRICE,
            note=f"analysis job {admitted.id}",
        )
        if admitted.status == JobStatus.PENDING:
            enqueue_process(admitted.id)
        if admitted.promoted is not None:
            # The slot was free but older jobs waited: the oldest started instead.
            enqueue_process(admitted.promoted)
        job = AnalysisJob.objects.only("pk", "user", "status", "created_at", "delta_of_job").get(
            pk=admitted.id
        )
        position = queue_position(job)
    return Admission(id=admitted.id, run_id=run_id, status=admitted.status, queue_position=position)


def _check_open_jobs(user: User) -> None:
    """Under the user's queue lock: refuse a job beyond ``MAX_QUEUED_ANALYSES_PER_USER``
    waiting or running ones (0 turns the bound off). One indexed probe of the limit-th
    open job, however long the queue."""
    limit = int(settings.MAX_QUEUED_ANALYSES_PER_USER)
    if limit <= 0:
        return
    open_jobs = AnalysisJob.objects.filter(
        user_id=user.pk, status__in=(JobStatus.QUEUED, *ACTIVE_STATUSES), deleted_at__isnull=True
    )
    if open_jobs.order_by()[limit - 1 : limit].exists():
        raise QueueFull(
            f"{limit} of your analyses are waiting or running, the most one user may have; "
            "admit more once some have finished"
        )


def promote_next(user_id: int) -> int | None:
    promoted = ANALYSIS_QUEUE.promote(key=user_id)
    if promoted is not None:
        enqueue_process(promoted)
    return promoted


def analysis_queue_promote(*, user_id: int) -> int | None:
    """Start the user's oldest queued job if nothing of theirs is active, and enqueue its
    ``process_job`` in the same transaction. Under the user's queue lock: two promoters
    never start two jobs; calling it again is a no-op."""
    with transaction.atomic():
        return promote_next(user_id)


def analysis_queue_resume(*, limit: int = 500) -> list[int]:
    """Promote for every user with queued work and nothing active (the resume tick).
    Each promotion takes the user's lock and re-checks, so a stale list is harmless."""
    promoted = []
    for user_id in ANALYSIS_QUEUE.stuck_keys(limit=limit):
        job_id = analysis_queue_promote(user_id=user_id)
        if job_id is not None:
            promoted.append(job_id)
    return promoted


def analysis_job_cancel(*, job_id: int) -> bool:
    """Cancel a queued job and refund its credit; False when it is no longer queued.
    Under the user's queue lock, so a promoter cannot start it meanwhile.

    A job that is not queued is refused before any lock: ``process_job`` takes the job's
    row lock and then the user's, so taking them the other way round here must only ever
    meet queued jobs (which no worker holds)."""
    row = AnalysisJob.objects.filter(pk=job_id).values_list("user_id", "status").first()
    if row is None or row[1] != JobStatus.QUEUED:
        return False
    user_id = row[0]
    with transaction.atomic():
        locks.xact_lock(ANALYSIS_QUEUE_LOCK, user_id)
        job = lock_job(job_id)
        if job is None or job.status != JobStatus.QUEUED:
            return False
        now = timezone.now()
        AnalysisJob.objects.filter(pk=job.pk).update(
            status=JobStatus.CANCELLED,
            error="cancelled by an operator",
            finished_at=now,
            updated_at=now,
        )
        credit_refund(job, note=f"analysis job {job.pk} cancelled")
    return True
