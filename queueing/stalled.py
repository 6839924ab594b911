"""Stalled-work recovery: jobs left in ``doing`` by a worker that died.

procrastinate has no built-in recovery (and its own ``retry_stalled_jobs`` recipe ignores
``max_attempts``). This sweep finds ``doing`` jobs whose worker stopped heart-beating
(or was pruned), and puts each back to ``todo`` — unless it already used
``QUEUEING_STALLED_MAX_ATTEMPTS`` attempts, then it fails for inspection.

procrastinate issues 1446/1543: a stalled job whose queueing lock is now held by a fresh
``todo`` job cannot go back to ``todo`` (unique violation), and a naive recovery stays
stuck on it forever. The fresh job will do the same work, so the stalled one is marked
failed ("superseded") instead, in its own savepoint. Never put a procrastinate ``lock`` on
this task (issue 1599): it would block behind the very jobs it must recover.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import IntegrityError, connection, transaction

from queueing.sql import queries
from queueing.sweeps import SweepContext, SweepResult, declare_sweep, sweep_rows

logger = logging.getLogger(__name__)


def _max_attempts() -> int:
    return int(getattr(settings, "QUEUEING_STALLED_MAX_ATTEMPTS", 5))


def _recover(row) -> str:
    job_id, attempts, task_name, queueing_lock = row
    with connection.cursor() as cursor:
        if attempts + 1 >= _max_attempts():
            cursor.execute(queries["fail_stalled_job"], {"job_id": job_id})
            logger.warning(
                "stalled job %s (%s) failed after %d attempts", job_id, task_name, attempts + 1
            )
            return "gave_up"
        try:
            with transaction.atomic():
                cursor.execute(queries["retry_stalled_job"], {"job_id": job_id})
        except IntegrityError:
            cursor.execute(queries["fail_stalled_job"], {"job_id": job_id})
            logger.warning(
                "stalled job %s (%s) superseded by a waiting job with lock %r",
                job_id,
                task_name,
                queueing_lock,
            )
            return "superseded"
    logger.warning("stalled job %s (%s) put back to todo", job_id, task_name)
    return "retried"


@declare_sweep(
    name="stalled_jobs",
    cron="* * * * * */15",
    batch_size=100,
    grace_setting="QUEUEING_STALLED_WORKER_SECONDS",
    grace_default=30,
)
def recover_stalled_jobs(ctx: SweepContext) -> SweepResult:
    """Retry jobs whose worker died (no heartbeat for the grace period)."""
    result = sweep_rows(
        ctx,
        select_sql=queries["stalled_jobs"],
        params={"seconds": ctx.grace_seconds},
        process=_recover,
    )
    changed = sum(result.notes.values())
    return SweepResult(
        selected=result.selected, changed=changed, failed=result.failed, notes=result.notes
    )
