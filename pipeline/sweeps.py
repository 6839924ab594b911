"""The pipeline's sweeps: resuming stopped pipelines, cleaning up staged uploads.

``pipeline_resume`` (every 30 s): re-enqueue the first unfinished stage of an inquiry that
has no live job once it has been idle for ``PIPELINE_RESUME_GRACE_SECONDS``, at most
``PIPELINE_MAX_RESUMES`` times, then give up visibly (``pipeline.resume``).

``staged_uploads`` (hourly), the staging cleanup: staged upload bytes leave the disk once
no inquiry needs them.

Submit stages an upload's bytes before its inquiry commits; intake copies them to the
inquiry's storage key. A staged blob is deleted once it is older than
``STAGING_RETENTION_SECONDS`` (by modification time; a re-upload refreshes it) and no
inquiry whose intake has not succeeded names it (an intake failed for the whole grace
period, e.g. on an unreadable upload, no longer counts). The delete happens under the blob's
advisory lock after a re-check, and submit stages under the same lock, so a blob an
inquiry is committing with is never lost. A replayed intake falls back to the stored copy.

Upload files in ``incoming/`` belong to requests being read; one older than the grace
period was left by a process that died mid-request, and goes too.
"""

from __future__ import annotations

import time

from django.db import connection, transaction

from pipeline import storage
from pipeline.queries import QUERIES
from pipeline.resume import RESUME_PERIOD_SECONDS, ResumeOutcome, anfrage_resume, candidate_params
from pipeline.submit import STAGING_LOCK
from queueing import locks
from queueing.sweeps import SweepContext, SweepResult, declare_sweep, sweep_rows


@declare_sweep(
    name="pipeline_resume",
    cron=f"* * * * * */{RESUME_PERIOD_SECONDS}",
    batch_size=100,
    grace_setting="PIPELINE_RESUME_GRACE_SECONDS",
    grace_default=60,
)
def resume_pipelines(ctx: SweepContext) -> SweepResult:
    """Re-enqueue stopped stages (bounded by PIPELINE_MAX_RESUMES, then give up)."""

    def process(row) -> bool | str:
        outcome = anfrage_resume(anfrage_id=row[0], grace_seconds=ctx.grace_seconds)
        return True if outcome is ResumeOutcome.RESUMED else outcome.value

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(QUERIES["resume_without_jit"])
        return sweep_rows(
            ctx,
            select_sql=QUERIES["resume_candidates"],
            params=candidate_params(grace_seconds=ctx.grace_seconds),
            process=process,
        )


def _in_use(hashes: list[str], grace_seconds: int) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(QUERIES["staged_blobs_in_use"], {"hashes": hashes, "grace": grace_seconds})
        return {row[0] for row in cursor.fetchall()}


@declare_sweep(
    name="staged_uploads",
    cron="17 * * * *",
    batch_size=500,
    grace_setting="STAGING_RETENTION_SECONDS",
    grace_default=24 * 3600,
)
def clean_staged_uploads(ctx: SweepContext) -> SweepResult:
    """Delete staged upload bytes no inquiry needs any more."""
    cutoff = time.time() - ctx.grace_seconds
    candidates = storage.staged_blobs(older_than=cutoff, limit=ctx.batch_size)
    in_use = _in_use(candidates, ctx.grace_seconds) if candidates else set()
    unused = [h for h in candidates if h not in in_use]
    leftovers = storage.incoming_leftovers(older_than=cutoff)[: ctx.batch_size]
    notes = {"incoming_leftovers": len(leftovers)} if leftovers else {}
    if ctx.dry_run:
        return SweepResult(selected=len(unused), notes=notes)
    for path in leftovers:
        path.unlink(missing_ok=True)
    deleted = 0
    for sha256 in unused:
        with transaction.atomic():
            locks.xact_lock(STAGING_LOCK, sha256)
            # Re-check under the lock: a submit may have committed a new reference.
            if not _in_use([sha256], ctx.grace_seconds) and storage.delete_staged(sha256):
                deleted += 1
    return SweepResult(selected=len(unused), changed=deleted, notes=notes)
