"""Stalled-work recovery: jobs left in ``doing`` by a worker that died.

procrastinate has no built-in recovery (and its own ``retry_stalled_jobs`` recipe ignores
``max_attempts``). This sweep finds ``doing`` jobs whose worker stopped heart-beating (or
was pruned) and puts each back to ``todo``; a job whose workers keep dying gives up after
``QUEUEING_STALLED_MAX_RECOVERIES`` recoveries and ends ``failed``; that statement
records the give-up hook it owes, which a worker that has the hook runs
(``queueing.giveup``), so its domain row settles even when the recovering worker lacks
the task.

Why it is built the way it is:

* **It is no job** (``declare_sweep(inline=True)``): every worker runs it in its own
  maintenance loop under the sweep's try-lock. A recovery job that dies in ``doing`` would
  hold its own key, and the only code that frees dead ``doing`` jobs would be the dead job
  (procrastinate #1408); a recovery *job* would also wait behind every job queued before
  it. It frees every sweep's dead job too.
* **Stalls are counted apart from attempts** (``pgstage_job_stalls``). procrastinate's
  ``attempts`` counts the task's own failures, ``RetryLater`` and backoff; a stage that
  retried four times and then lost its worker once must not be failed for good. A
  recovery does not count an attempt either: the task did not fail, its worker died.
* **Silence counts from the later of the last heartbeat, the server's start and the moment
  recovery resumed after a gap** (``Watch.resumed_at``), whoever runs it: the
  workers' maintenance loop, ``manage.py sweep``, the admin or an operator's retry all go
  through one clock and try-lock (``queueing.sweeps.watch``): after a PostgreSQL restart,
  a crash restart or a failover (which do not all move ``pg_postmaster_start_time()``),
  every heartbeat is old, yet the workers are alive and beat again within one heartbeat
  interval of the database's return (``queueing.worker``: the heartbeat has a connection
  of its own). A worker that stays silent for a whole threshold after recovery resumed
  (at least two heartbeats, ``queueing.W001``) is dead, and is recovered then.
* procrastinate issues 1446/1543: a stalled job whose queueing lock a fresh ``todo`` job
  now holds cannot go back to ``todo`` (unique violation). The fresh job will do the same
  work, so the stalled one ends ``failed`` ("superseded"), in its own savepoint.
* Never put a procrastinate ``lock`` on this task (issue 1599): it would block behind the
  very jobs it must recover.
* **A run past its timeout is ended here too** (``queueing.timeouts``), under the same
  try-lock and clock: its worker is alive, so its silence never would be. The run counts
  as a failed attempt (:class:`~queueing.exceptions.JobTimedOut`) and the task's retry
  strategy decides: one more attempt later, or ``failed`` with the owed give-up hook
  recorded in the same statement. Only tasks this process knows are judged (their
  strategy is code): a worker of another release leaves them to one that knows them.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper
from procrastinate import jobs, utils
from procrastinate.tasks import Task

from queueing import giveup, timeouts
from queueing.exceptions import JobTimedOut
from queueing.sql import queries
from queueing.sweeps import SweepContext, SweepResult, Watch, declare_sweep, sweep_rows

logger = logging.getLogger(__name__)

STALLED_SWEEP = "stalled_jobs"


def max_recoveries() -> int:
    return int(getattr(settings, "QUEUEING_STALLED_MAX_RECOVERIES", 3))


def _end(
    cursor: CursorWrapper, job_id: int, task_name: str, status: str, *, owed_reason: str | None
) -> None:
    """End the job for good; a give-up (``owed_reason``) records, in the same statement,
    the hook it owes, which a worker that has the hook runs (``giveup.settle_owed``)."""
    cursor.execute(
        queries["end_stalled_job"],
        {
            "job_id": job_id,
            "status": status,
            "owed_reason": owed_reason if giveup.owes(task_name) else None,
        },
    )


def recover_job(row: Sequence[Any], *, watch: Watch) -> str:
    """Recover one stalled job (the row of ``stalled_jobs``, locked by the caller): back to
    ``todo``, or ended for good when over budget, aborted or superseded. Returns which.
    Only under recovery's try-lock and clock: ``watch`` is what :func:`queueing.sweeps.watch`
    yielded to the caller, whose judgement that the job's worker is dead counted its
    silence from ``watch.resumed_at``."""
    if not isinstance(watch, Watch):
        raise TypeError("recover_job needs the Watch of queueing.sweeps.watch(STALLED_SWEEP)")
    job_id, task_name, queueing_lock, _args, abort_requested, worker_id = row
    with connection.cursor() as cursor:
        cursor.execute(queries["count_stall"], {"job_id": job_id, "worker_id": worker_id})
        (stalls,) = cursor.fetchone()
        if abort_requested:
            _end(
                cursor,
                job_id,
                task_name,
                "aborted",
                owed_reason=f"its job {job_id} was asked to abort and its worker died",
            )
            logger.warning("stalled job %s (%s) aborted as requested", job_id, task_name)
            return "aborted"
        if stalls > max_recoveries():
            _end(
                cursor,
                job_id,
                task_name,
                "failed",
                owed_reason=f"its job {job_id} lost its worker {stalls} times "
                f"(QUEUEING_STALLED_MAX_RECOVERIES={max_recoveries()})",
            )
            logger.warning(
                "stalled job %s (%s) failed: its worker died %d times", job_id, task_name, stalls
            )
            return "gave_up"
        try:
            with transaction.atomic():
                cursor.execute(queries["requeue_stalled_job"], {"job_id": job_id})
        except IntegrityError:
            _end(cursor, job_id, task_name, "failed", owed_reason=None)
            logger.warning(
                "stalled job %s (%s) superseded by a waiting job with lock %r",
                job_id,
                task_name,
                queueing_lock,
            )
            return "superseded"
    logger.warning(
        "stalled job %s (%s) put back to todo (stall %d of at most %d)",
        job_id,
        task_name,
        stalls,
        max_recoveries(),
    )
    return "retried"


def _known_tasks() -> dict[str, Task]:
    from procrastinate.contrib.django import app

    return dict(app.tasks)


def end_timed_out_job(row: Sequence[Any], *, watch: Watch) -> str:
    """End one run past its timeout (a row of ``timed_out_jobs``, locked by the caller)
    as a failed attempt: retried when its task's retry strategy says so, else failed
    (owing its give-up hook, in the same statement); aborted when an abort was
    requested; superseded when a waiting job holds its queueing lock. Returns which.
    Only under recovery's try-lock and clock (see :func:`recover_job`)."""
    if not isinstance(watch, Watch):
        raise TypeError("end_timed_out_job needs the Watch of queueing.sweeps.watch(STALLED_SWEEP)")
    columns = (
        "id", "status", "task_name", "priority", "lock", "queueing_lock", "args",
        "scheduled_at", "queue_name", "attempts", "abort_requested", "worker_id",
    )  # fmt: skip
    job = jobs.Job.from_row(dict(zip(columns, row, strict=True)))
    assert job.id is not None
    bound = timeouts.timeout_seconds(job.task_name)
    error = JobTimedOut(f"its run outlived its timeout ({bound:g} s)")
    with connection.cursor() as cursor:
        if job.abort_requested:
            _end(
                cursor,
                job.id,
                job.task_name,
                "aborted",
                owed_reason=f"its job {job.id} was asked to abort and its run hung",
            )
            logger.warning("timed-out job %s (%s) aborted as requested", job.id, job.task_name)
            return "aborted"
        task = _known_tasks().get(job.task_name)
        job_retry = task.get_retry_exception(exception=error, job=job) if task else None
        if job_retry is None:
            _end(
                cursor,
                job.id,
                job.task_name,
                "failed",
                owed_reason=f"its job {job.id} failed for good after {job.attempts + 1} "
                f"attempt(s): {error}",
            )
            logger.warning(
                "job %s (%s) failed: its run outlived its timeout (%g s), attempt %d was its last",
                job.id,
                job.task_name,
                bound,
                job.attempts + 1,
            )
            return "timed_out_failed"
        decision = job_retry.retry_decision
        try:
            with transaction.atomic():
                cursor.execute(
                    queries["retry_timed_out_job"],
                    {
                        "job_id": job.id,
                        "retry_at": decision.retry_at or utils.utcnow(),
                        "priority": decision.priority,
                        "queue": decision.queue,
                        "lock": decision.lock,
                    },
                )
        except IntegrityError:
            _end(cursor, job.id, job.task_name, "failed", owed_reason=None)
            logger.warning(
                "timed-out job %s (%s) superseded by a waiting job with lock %r",
                job.id,
                job.task_name,
                job.queueing_lock,
            )
            return "superseded"
    logger.warning(
        "job %s (%s): its run outlived its timeout (%g s), attempt %d; retried at %s "
        "(the hung run's outcome will not be saved)",
        job.id,
        job.task_name,
        bound,
        job.attempts + 1,
        decision.retry_at,
    )
    return "timed_out_retried"


@declare_sweep(
    name=STALLED_SWEEP,
    batch_size=100,
    grace_setting="QUEUEING_STALLED_WORKER_SECONDS",
    grace_default=30,
    inline=True,
    every_setting="QUEUEING_STALLED_RECOVERY_SECONDS",
    every_default=5,
)
def recover_stalled_jobs(ctx: SweepContext) -> SweepResult:
    """Retry jobs whose worker died (no heartbeat for the grace period), and end runs
    past their timeout as failed attempts."""
    if ctx.watch is None:
        raise TypeError("stalled recovery runs through queueing.sweeps.run_sweep only")
    result = sweep_rows(
        ctx,
        select_sql=queries["stalled_jobs"],
        params={"seconds": ctx.grace_seconds, "resumed_at": ctx.watch.resumed_at},
        process=functools.partial(recover_job, watch=ctx.watch),
    ) + sweep_rows(
        ctx,
        select_sql=queries["timed_out_jobs"],
        params={
            "grace": timeouts.grace_seconds(),
            "resumed_at": ctx.watch.resumed_at,
            "known": sorted(_known_tasks()),
        },
        process=functools.partial(end_timed_out_job, watch=ctx.watch),
    )
    changed = sum(result.notes.values())
    return SweepResult(
        selected=result.selected, changed=changed, failed=result.failed, notes=result.notes
    )
