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
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.backends.utils import CursorWrapper

from queueing import giveup
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
    """Retry jobs whose worker died (no heartbeat for the grace period)."""
    if ctx.watch is None:
        raise TypeError("stalled recovery runs through queueing.sweeps.run_sweep only")
    result = sweep_rows(
        ctx,
        select_sql=queries["stalled_jobs"],
        params={"seconds": ctx.grace_seconds, "resumed_at": ctx.watch.resumed_at},
        process=functools.partial(recover_job, watch=ctx.watch),
    )
    changed = sum(result.notes.values())
    return SweepResult(
        selected=result.selected, changed=changed, failed=result.failed, notes=result.notes
    )
