"""Retention: finished jobs leave the job table after a while.

Every sweep tick and every stage adds jobs; without retention ``procrastinate_jobs`` (and
its events) grows without bound and slows the fetch query. This sweep deletes jobs that
*succeeded*, were *cancelled* or *aborted* and saw no event for
``QUEUEING_JOB_RETENTION_SECONDS`` (3 days); *failed* jobs stay for inspection (replay
them, or delete them by hand). Batches are taken ``FOR UPDATE SKIP LOCKED``, so two
sweeps delete disjoint jobs; events go with their job (``ON DELETE CASCADE``) and
procrastinate's own trigger unlinks periodic-defer rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection

from queueing.sql import queries
from queueing.sweeps import SweepContext, SweepResult, declare_sweep, sweep_rows


def _delete(row: Sequence[Any]) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(queries["delete_finished_job"], {"job_id": row[0]})
        return cursor.rowcount == 1


@declare_sweep(
    name="finished_jobs",
    cron="*/10 * * * *",
    batch_size=1000,
    grace_setting="QUEUEING_JOB_RETENTION_SECONDS",
    grace_default=3 * 24 * 3600,
)
def delete_finished_jobs(ctx: SweepContext) -> SweepResult:
    """Delete succeeded, cancelled and aborted jobs past the retention period."""
    return sweep_rows(
        ctx,
        select_sql=queries["finished_jobs"],
        params={"seconds": ctx.grace_seconds},
        process=_delete,
    )
