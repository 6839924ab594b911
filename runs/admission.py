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
from queueing.serial import Refused, StartJob
from runs import credits
from runs import judge as judging
from runs.core import get_core, held_run_give_back, queries
from runs.credits import ANALYSIS_PRICE, credit_refund
from runs.exceptions import (
    BudgetExhausted,
    CoreUnavailable,
    HoldExpired,
    InsufficientCredits,
    NoCitations,
    ParentNotComplete,
    QueueFull,
    RunsError,
    TooManyCitations,
    UserInactive,
)
from runs.models import (
    AnalysisJob,
    JobStatus,
)
from runs.queue import (
    ANALYSIS_QUEUE,
    ANALYSIS_QUEUE_LOCK,
    PROCESS_JOB_KEY,
    PROCESS_JOB_TASK,
    RUNS_QUEUE,
)
from runs.selectors import (
    analysis_job_for_user,
    credit_balance,
    remember_tenant_slug,
    tenant_slug,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Admission:
    id: int
    run_id: uuid.UUID
    status: str
    queue_position: int


def enqueue_process(job_id: int, *, tenant_id: int) -> Enqueued:
    """``process_job`` of the job, under its EXCLUSIVE key. The tenant's slug rides along
    as an argument, only so the job's log lines name the tenant (the key stays the job)."""
    return enqueue(
        PROCESS_JOB_TASK,
        args={"job_id": job_id, "tenant": tenant_slug(tenant_id)},
        key=PROCESS_JOB_KEY.build(job=job_id),
        policy=Policy.EXCLUSIVE,
        queue=RUNS_QUEUE,
    )


def lock_job(job_id: int, *, skip_locked: bool = False) -> AnalysisJob | None:
    """The job's row, locked (``FOR UPDATE``) until the transaction ends; None when it is
    missing, deleted or (``skip_locked``) locked by another transaction."""
    return (
        AnalysisJob.objects.select_for_update(skip_locked=skip_locked)
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

    One round trip (the serial queue's admit): under the user's queue lock, one statement
    checks the balance, the bound on open jobs and that the user is active, creates the
    local core's held run (taking a unit of the tenant's daily budget), inserts the job
    with its status and position, charges it and enqueues the ``process_job`` of the job
    it started (this one, or the oldest queued one when the slot was free); the lock, the
    statement and the commit travel together, so the lock and the tenant's budget row are
    held for the server's time only. A refused admission writes nothing (no held run, no
    budget unit, no charge) and names its reason as the statement saw it. Two concurrent
    admits of one user can neither both take the slot, nor pass the bound, nor overdraw
    the balance. A deactivated user is refused (:class:`UserInactive`) before anything is
    written.

    A core that cannot join the statement (a remote one) creates the held run first, in
    a call of its own, so a slow core never holds the user's lock; a refusal then cancels
    it, giving its budget back (see docs/runs.md).
    """
    if not user.is_active:
        raise _inactive(user)
    citations = judging.count_citations(doc_html)
    if not citations:
        raise NoCitations()
    if citations > judging.MAX_CITATIONS:
        raise TooManyCitations(
            f"the document holds {citations} citations; at most {judging.MAX_CITATIONS} "
            "per analysis"
        )
    parent = None
    if delta_of_job_id is not None:
        parent = analysis_job_for_user(user=user, job_id=delta_of_job_id)
        if parent.status != JobStatus.COMPLETE:
            raise ParentNotComplete(
                f"job {parent.pk} is {parent.status}; a delta re-check needs a complete analysis"
            )
    run_id = parent.run_id if parent else (run_id or uuid.uuid4())
    remember_tenant_slug(user)  # for the process_job's log lines, without a read
    values = {
        "tenant": user.tenant_id,
        "run_id": run_id,
        "delta_of_job": parent.pk if parent else None,
        "title": title,
        "doc_html": doc_html,
        "sources": [dict(s) for s in sources],
        "error": "",
        "release_attempts": 0,
    }
    params: dict[str, object] = {
        "user_id": user.pk,
        "price": ANALYSIS_PRICE,
        "open_limit": int(settings.MAX_QUEUED_ANALYSES_PER_USER),
        "fold_after": credits.FOLD_AFTER,
    }
    start_job = StartJob(
        task=PROCESS_JOB_TASK,
        id_arg="job_id",
        args={"tenant": tenant_slug(user.tenant_id)},
        key=PROCESS_JOB_KEY,
        policy=Policy.EXCLUSIVE,
        queue=RUNS_QUEUE,
    )
    core = get_core()
    if getattr(core, "joins_admission", False):
        params.update(core.held_params(run_id=run_id, user_id=user.pk, sources=sources))
        admitted = ANALYSIS_QUEUE.admit(
            key=user.pk,
            values=values,
            before=f"{queries['admit_checks']}, {queries['admit_local_hold']}",
            guard=queries["admit_held_created"],
            computed={"core_run": queries["admit_held_run"]},
            then=f"{queries['admit_charge']}, {queries['admit_fold']}",
            report=queries["admit_report"],
            start_job=start_job,
            params=params,
        )
        if isinstance(admitted, Refused):
            raise _refusal(user, admitted.report, hold_created=False)
    else:
        core_run_id = core.create_held(run_id=run_id, user_id=user.pk, sources=sources)
        try:
            admitted = ANALYSIS_QUEUE.admit(
                key=user.pk,
                values={**values, "core_run": core_run_id},
                before=queries["admit_checks"],
                guard=queries["admit_guard"],
                then=f"{queries['admit_charge']}, {queries['admit_fold']}",
                report=queries["admit_report"],
                start_job=start_job,
                params={**params, "core_run_id": core_run_id},
            )
            if isinstance(admitted, Refused):
                raise _refusal(user, admitted.report, hold_created=True)
        except BaseException:
            try:
                core.cancel_held(core_run_id=core_run_id)
            except Exception:
                # The refusal is what the caller must see; an uncancelled hold expires
                # with the resume tick (held_runs_expire).
                logger.exception("could not cancel held core run %s", core_run_id)
            raise
    return Admission(
        id=admitted.id, run_id=run_id, status=admitted.status, queue_position=admitted.position
    )


def held_runs_expire(*, limit: int = 500) -> int:
    """Cancel held core runs no live job needs, giving their budget back (the resume
    tick's net): those no admission took, older than ``CORE_HELD_EXPIRY_SECONDS`` (an
    admission died between creating its held run and committing its job), and those
    whose job ended without releasing them while the core was unreachable; and fail the
    released runs whose jobs all ended while the core was unreachable (no budget given
    back). Idempotent; 0 while the core is unreachable (the next tick tries again)."""
    try:
        return get_core().expire_held(
            older_than_seconds=float(settings.CORE_HELD_EXPIRY_SECONDS), limit=limit
        )
    except CoreUnavailable:
        logger.warning("the core is unreachable: held runs are expired on a later tick")
        return 0


def _inactive(user: User) -> UserInactive:
    return UserInactive(f"user {user.get_username()} is deactivated; nothing was charged")


def _refusal(user: User, report: Sequence[object], *, hold_created: bool) -> RunsError:
    """Why the admission's statement refused, from the checks it reported (``funded``,
    ``room``, ``active``, read under the user's lock). All passed: the held run was
    missing — the tenant's budget was used up (the statement creates the held run), or
    the run created before the lock expired while the admission waited for it."""
    funded, room, active = report
    if not active:
        return _inactive(user)
    if not funded:
        balance = credit_balance(user_id=user.pk)
        return InsufficientCredits(
            f"the balance is {balance} credit(s) and an analysis costs {ANALYSIS_PRICE}; "
            "ask an operator to run manage.py grant_credits"
        )
    if not room:
        limit = int(settings.MAX_QUEUED_ANALYSES_PER_USER)
        return QueueFull(
            f"{limit} of your analyses are waiting or running, the most one user may have; "
            "admit more once some have finished"
        )
    if hold_created:
        return HoldExpired(
            "this admission waited longer than CORE_HELD_EXPIRY_SECONDS for its queue and "
            "its held provider run expired; nothing was charged: admit it again"
        )
    return BudgetExhausted()


def promote_next(user_id: int, *, tenant_id: int | None = None) -> int | None:
    """Start the user's oldest queued job if the slot is free (``tenant_id``: the user's,
    when the caller knows it)."""
    promoted = ANALYSIS_QUEUE.promote(key=user_id)
    if promoted is not None:
        if tenant_id is None:
            tenant_id = User.objects.values_list("tenant_id", flat=True).get(pk=user_id)
        enqueue_process(promoted, tenant_id=tenant_id)
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


def analysis_job_cancel(*, job_id: int, reason: str = "cancelled by an operator") -> bool:
    """Cancel a queued job, refund its credit and give its held core run (and the
    tenant's budget unit) back; False when it is no longer queued. Under the user's
    queue lock, so a promoter cannot start it meanwhile.

    A job that is not queued is refused before any lock: ``process_job`` takes the job's
    row lock and then the user's, so taking them the other way round here must only ever
    meet queued jobs (which no worker holds)."""
    row = AnalysisJob.objects.filter(pk=job_id).values_list("user_id", "status").first()
    if row is None or row[1] != JobStatus.QUEUED:
        return False
    user_id = row[0]
    with transaction.atomic():
        locks.xact_lock(ANALYSIS_QUEUE_LOCK, user_id)
        # Still queued, read again under the user's lock: only a promotion (which takes
        # that lock) starts it, so it stays queued and no process_job holds its row. One
        # promoted while this waited for the lock may have a process_job that holds the
        # row and wants the lock: locking the row then would deadlock with it.
        if not AnalysisJob.objects.filter(pk=job_id, status=JobStatus.QUEUED).exists():
            return False
        job = lock_job(job_id)
        if job is None or job.status != JobStatus.QUEUED:
            return False
        now = timezone.now()
        AnalysisJob.objects.filter(pk=job.pk).update(
            status=JobStatus.CANCELLED,
            error=reason,
            finished_at=now,
            updated_at=now,
        )
        credit_refund(job, note=f"analysis job {job.pk} cancelled")
        held_run_give_back(core_run_id=job.core_run_id)
    return True
