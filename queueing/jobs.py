"""Operators' actions on procrastinate's jobs, routed through the framework.

procrastinate's own tools break the framework's invariants: its admin's *retry* puts a
``doing`` job back to ``todo`` while a live worker still runs it (the job runs twice),
and retrying a failed job whose singleton key a fresh job now holds is a bare unique
violation; its *cancel* leaves the cancelled job's domain row waiting for ever. These
services do what an operator means:

* :func:`job_retry` — a failed job goes back to ``todo`` unless a live job already holds
  its key (then it points at that job: it does the same work); a ``doing`` job is refused
  while its worker is alive, and recovered now (as stalled recovery would) once it is not.
* :func:`job_cancel` — a waiting job is cancelled and its task's give-up hook settles the
  domain row (e.g. marks it failed and hands its slot to the next one).
* :func:`unrunnable_tasks` — the task names of waiting jobs that no live worker has (a
  worker fetches only its own tasks' jobs): they wait, visibly, for a worker that has
  the task, or for an operator's cancel.

Each runs in one transaction under the job's row lock, so it cannot race the job's worker
finishing it or stalled recovery taking it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper
from procrastinate.contrib.django.models import ProcrastinateJob

from queueing import giveup
from queueing.exceptions import QueueingError
from queueing.planner import rows_walking
from queueing.sql import queries
from queueing.stalled import STALLED_SWEEP, recover_job
from queueing.sweeps import get_sweep, watch

__all__ = ["CancelRefused", "Retried", "Unrunnable", "job_cancel", "job_retry", "unrunnable_tasks"]


class RetryOutcome(enum.StrEnum):
    RETRIED = "retried"
    DEDUPLICATED = "deduplicated"
    RECOVERED = "recovered"
    RUNNING = "running"
    WAITING_FOR_RECOVERY = "waiting_for_recovery"
    NOT_RETRYABLE = "not_retryable"
    MISSING = "missing"


@dataclass(frozen=True, kw_only=True)
class Retried:
    outcome: RetryOutcome
    job_id: int
    #: The job that holds the key (DEDUPLICATED) — it does the same work.
    holder_id: int | None = None
    detail: str = ""


def _holder(cursor: CursorWrapper, job_id: int, queueing_lock: str | None) -> int | None:
    if queueing_lock is None:
        return None
    cursor.execute(queries["key_holder"], {"job_id": job_id, "queueing_lock": queueing_lock})
    row = cursor.fetchone()
    return row[0] if row else None


def job_retry(*, job_id: int) -> Retried:
    """Retry one job as an operator means it (see the module docstring). Idempotent: a
    second call finds the job waiting (``NOT_RETRYABLE``) or deduplicated. A ``doing``
    job is judged under stalled recovery's try-lock and clock (``queueing.sweeps.watch``),
    as recovery itself judges it."""
    recovery = get_sweep(STALLED_SWEEP)
    with watch(STALLED_SWEEP) as clock, connection.cursor() as cursor:
        cursor.execute(
            queries["job_for_operator"],
            {"job_id": job_id, "seconds": recovery.grace_seconds, "clock": recovery.name},
        )
        row = cursor.fetchone()
        if row is None:
            return Retried(outcome=RetryOutcome.MISSING, job_id=job_id)
        _, status, task_name, queueing_lock, args, abort_requested, worker_id = row[:7]
        worker_alive = row[7]
        if status == "doing":
            if clock is None:
                return Retried(
                    outcome=RetryOutcome.WAITING_FOR_RECOVERY,
                    job_id=job_id,
                    detail="stalled recovery is running right now and takes this job back "
                    "if its worker is dead; look again in a moment",
                )
            if clock.resumed_now:
                unwatched = clock.unwatched_seconds
                return Retried(
                    outcome=RetryOutcome.WAITING_FOR_RECOVERY,
                    job_id=job_id,
                    detail=(
                        f"stalled recovery had not run for {unwatched:.0f} s"
                        if unwatched is not None
                        else "stalled recovery had never run"
                    )
                    + ": no worker is running (or the database was just away, and its "
                    "worker may not have beaten yet). Start a worker: its recovery takes "
                    "this job back once the job's worker has been silent for "
                    f"STALLED_WORKER_SECONDS ({recovery.grace_seconds} s) after it started",
                )
            if worker_alive:
                return Retried(
                    outcome=RetryOutcome.RUNNING,
                    job_id=job_id,
                    detail=f"worker {worker_id} is running it and still heart-beating; "
                    "retrying it now would run it twice",
                )
            note = recover_job(
                (job_id, task_name, queueing_lock, args, abort_requested, worker_id), watch=clock
            )
            return Retried(outcome=RetryOutcome.RECOVERED, job_id=job_id, detail=note)
        if status != "failed":
            return Retried(
                outcome=RetryOutcome.NOT_RETRYABLE,
                job_id=job_id,
                detail=f"it is {status}; only failed jobs (and stalled ones) are retried",
            )
        holder = _holder(cursor, job_id, queueing_lock)
        if holder is None:
            try:
                with transaction.atomic():
                    cursor.execute(queries["retry_failed_job"], {"job_id": job_id})
                return Retried(outcome=RetryOutcome.RETRIED, job_id=job_id)
            except IntegrityError:
                # A fresh job took the key between the look-up and the retry.
                holder = _holder(cursor, job_id, queueing_lock)
        return Retried(
            outcome=RetryOutcome.DEDUPLICATED,
            job_id=job_id,
            holder_id=holder,
            detail=f"job {holder} holds its singleton key {queueing_lock!r} and does the same work",
        )


@dataclass(frozen=True, kw_only=True)
class Unrunnable:
    """Waiting jobs of one task name that no live worker takes: none has the task, or
    none that has it listens to their queues."""

    task_name: str
    jobs: int
    oldest_job_id: int
    #: The queues these jobs wait on.
    queues: tuple[str, ...]


def unrunnable_tasks() -> list[Unrunnable]:
    """Per task name, the waiting jobs that no live worker takes: none has the task, or
    none that has it listens to the job's queue (a worker is live when it beat within
    ``QUEUEING_STALLED_WORKER_SECONDS``). They wait until a worker that takes them runs,
    or an operator cancels them (docs/deploy.md). Silence counts as stalled recovery
    counts it (from when it resumed after a gap). One read, no lock; its cost does not
    grow with the waiting jobs that have a worker (one index descent per distinct task
    and queue of the waiting jobs), only with the jobs it counts."""
    seconds = float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))
    rows = rows_walking(queries["unrunnable_tasks"], {"seconds": seconds, "clock": STALLED_SWEEP})
    return [
        Unrunnable(
            task_name=row["task_name"],
            jobs=row["jobs"],
            oldest_job_id=row["oldest_job_id"],
            queues=tuple(row["queues"]),
        )
        for row in rows
    ]


class CancelRefused(QueueingError):
    """This job's task may not be cancelled: nothing else would do its work."""


def job_cancel(*, job_id: int, actor: str) -> bool:
    """Cancel a waiting job and settle its domain row through its task's give-up hook;
    False when the job is not waiting (running jobs finish; failed ones are over).

    One transaction under the job's row: the statement that cancels records the owed
    hook (``queueing.giveup``), and when this process has the hook it runs at once, in
    the same transaction; otherwise a worker that has it runs it. A job of a task this
    process does not know (removed in this release; see docs/deploy.md) may be cancelled
    too: no worker here could run it. Raises :class:`CancelRefused` for a known task whose
    work nothing else would do (no hook, not declared cancellable)."""
    task_name = (
        ProcrastinateJob.objects.filter(pk=job_id).values_list("task_name", flat=True).first()
    )
    if task_name is None:
        return False
    if task_name in giveup.known_tasks() and not giveup.is_cancellable(task_name):
        raise CancelRefused(
            f"job {job_id} ({task_name}) cannot be cancelled: nothing else would do its work "
            "and its row would wait for ever; fix what it waits for, or settle the row "
            "it works on instead"
        )
    reason = f"its job {job_id} was cancelled by {actor}"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            queries["cancel_waiting_job"],
            {"job_id": job_id, "owed_reason": reason if giveup.owes(task_name) else None},
        )
        if cursor.fetchone() is None:
            return False
        if giveup.has_hook(task_name):
            giveup.settle_owed(job_id=job_id)
    return True
