"""The analyses' periodic work, each a framework sweep (a tick that enqueues a singleton
job, so a slow run never blocks the tick and never stacks; SIGTERM drains it).

* ``unsaved_runs`` (every 30 s): the backstop — record runs the browser never saved.
* ``analysis_resume`` (every 30 s): give up expired releases (refunding them), cancel
  deactivated users' queued jobs (refunding them), promote users with queued work and
  nothing active, re-enqueue active jobs whose task is gone, cancel held core runs no
  live job needs (giving their budget back).
* ``doc_html_trim`` (every 10 min): clear old bodies, never one whose run is missing.
"""

from __future__ import annotations

from django.conf import settings

from queueing.sweeps import SweepContext, SweepResult, declare_sweep, sweep_rows
from runs import admission, durability, processing, selectors
from runs.core import LocalCore, get_core, queries
from runs.models import SavedBy


def _record_unsaved(row) -> bool:
    job_id, _run_id = row
    return durability.analysis_run_record(job_id=job_id, saved_by=SavedBy.WORKER).written


@declare_sweep(
    name="unsaved_runs",
    cron="* * * * * */30",
    batch_size=100,
    grace_setting="SWEEP_GRACE_SECONDS",
    grace_default=120,
)
def record_unsaved_runs(ctx: SweepContext) -> SweepResult:
    """Record runs of terminal jobs no browser saved within the grace period."""
    return sweep_rows(
        ctx,
        select_sql=queries["unsaved_runs"],
        params={"grace_seconds": ctx.grace_seconds},
        process=_record_unsaved,
    )


def _give_up(row) -> bool:
    # Its own transaction (``commit_each``), passing over a job whose process_job holds
    # it (attempting the release right now: it decides itself).
    return processing.analysis_job_give_up(job_id=row[0], skip_locked=True)


@declare_sweep(name="analysis_resume", cron="* * * * * */30", batch_size=100, grace_default=60)
def resume_analysis_queue(ctx: SweepContext) -> SweepResult:
    """Fail expired releases (refunded), cancel deactivated users' queued jobs
    (refunded), promote stuck queues, re-enqueue lost jobs, cancel held core runs no live
    job needs and fail released ones whose jobs all ended (both counted as
    ``held_expired``).

    One read-only probe first (``selectors.resume_work``): a part runs its batch when the
    probe found work for it, so a tick with nothing to do is that one statement. Once a
    part changed anything, every later part runs whatever the probe said, as it would
    without one: a give-up's or a cancel's give-back of its held run is best effort, and
    the expiry that follows is its net."""
    core = get_core()
    work = selectors.resume_work(
        idle_seconds=ctx.grace_seconds, held_seconds=float(settings.CORE_HELD_EXPIRY_SECONDS)
    )
    # Each give-up commits on its own: it takes its user's queue lock (promoting the next
    # job) and its tenant's budget row (giving the held run back), and a batch holding
    # one user's budget row while it takes the next user's lock deadlocks with that
    # user's admission, which takes them the other way round.
    expired = (
        sweep_rows(
            ctx,
            select_sql=queries["expired_releases"],
            params={},
            process=_give_up,
            commit_each=True,
        )
        if work.expired_releases
        else SweepResult()
    )
    if ctx.dry_run:
        return expired
    # Rows changed so far: from the first change on, every part runs.
    moved = expired.changed
    # Before promoting: a deactivated user's queued job must not start.
    deactivated = (
        processing.analysis_jobs_cancel_deactivated(limit=ctx.batch_size)
        if work.deactivated or moved
        else 0
    )
    moved += deactivated
    promoted = admission.analysis_queue_resume(limit=ctx.batch_size) if work.stuck or moved else []
    moved += len(promoted)
    lost = (
        processing.analysis_jobs_requeue_lost(idle_seconds=ctx.grace_seconds, limit=ctx.batch_size)
        if work.lost or moved
        else processing.Requeued(requeued=0, abandoned=0)
    )
    moved += lost.requeued + lost.abandoned
    # The probe reads the local core's runs; another core's expiry is its own business.
    orphans = (
        admission.held_runs_expire(limit=ctx.batch_size)
        if work.held_runs or moved or not isinstance(core, LocalCore)
        else 0
    )
    changed = deactivated + len(promoted) + lost.requeued + lost.abandoned + orphans
    return SweepResult(
        selected=expired.selected + changed,
        changed=expired.changed + changed,
        failed=expired.failed,
        notes={
            "gave_up": expired.changed,
            "deactivated_cancelled": deactivated,
            "promoted": len(promoted),
            "requeued": lost.requeued,
            "abandoned": lost.abandoned,
            "held_expired": orphans,
        },
    )


@declare_sweep(name="doc_html_trim", cron="*/10 * * * *", batch_size=500)
def trim_doc_html(ctx: SweepContext) -> SweepResult:
    """Clear doc_html of jobs ended DOC_HTML_TRIM_HOURS ago, keeping unsaved ones."""
    hours = int(settings.DOC_HTML_TRIM_HOURS)
    if ctx.dry_run:
        return SweepResult()
    result = durability.doc_html_trim(hours=hours, limit=ctx.batch_size)
    return SweepResult(
        selected=result.trimmed + len(result.kept_unsaved),
        changed=result.trimmed,
        notes={"kept_unsaved": len(result.kept_unsaved)},
    )
