"""Replays: an operator runs a stage again (with ``cascade``, the stages after it too).

A replay is audited and happens in one transaction. It first locks the inquiry's ledger
rows ``FOR UPDATE`` in the fixed stage order (intake, extract, feasibility, calculate),
then decides and writes in new statements: it reopens the successful target stages
(compare-and-set on ``success``), resets their resume count and give-up, reopens the
inquiry (``completed_at``), enqueues the stage under its EXCLUSIVE key and writes a
``stage.replayed`` audit entry.

Why lock first: a stage's closing transaction share-locks the stage before it and then
marks its own row ``success``. Without the lock, a reopening statement whose snapshot
predates that commit would skip the row (it was ``running`` then) and leave a result
computed from the output being replayed. With it, the replay waits for the closing
transaction and its reopening statement sees the commit. The order cannot deadlock:
closing transactions lock in ascending stage order too (the previous stage's row, then
their own), a claim, a renewal or a failure locks one row in one statement, and the
replay takes the inquiry's row only after the ledger rows (the resume sweep, which holds
the inquiry's row first, never waits for a ledger row: it skips locked ones).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from pipeline.audit import audit_entry_create
from pipeline.exceptions import ReplayRefused
from pipeline.models import REPLAY_REASON_PREFIX, Anfrage, Stage
from pipeline.queries import QUERIES
from pipeline.selectors import anfrage_get, parse_stage
from pipeline.stages import pipeline_stage_enqueue
from queueing.ledger import LedgerStatus


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    anfrage_id: int
    stage: Stage
    reopened: tuple[str, ...]
    job_id: int | None
    enqueued: bool
    dry_run: bool


@dataclass(frozen=True, kw_only=True)
class _LockedRun:
    stage: str
    status: str
    lease_expires_at: datetime.datetime | None
    lease_live: bool


def _lock_runs(anfrage: Anfrage) -> dict[str, _LockedRun]:
    """Lock the inquiry's ledger rows in the fixed stage order (in the caller's
    transaction); a stage's closing transaction in flight is waited for, and its commit is
    what this returns."""
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["replay_lock_runs"],
            {"tenant_id": anfrage.tenant_id, "anfrage_id": anfrage.id, "stages": Stage.values},
        )
        return {
            row[0]: _LockedRun(
                stage=row[0], status=row[1], lease_expires_at=row[2], lease_live=row[3]
            )
            for row in cursor.fetchall()
        }


def _refuse(
    *,
    anfrage: Anfrage,
    stage: Stage,
    targets: tuple[Stage, ...],
    runs: dict[str, _LockedRun],
    force: bool,
) -> list[str]:
    """Raise ``ReplayRefused`` when the locked rows forbid the replay; else return the
    targets that succeeded (those a forced replay reopens)."""
    for earlier in stage.previous:
        run = runs.get(earlier.value)
        if run is None or run.status != LedgerStatus.SUCCESS:
            status = run.status if run else "pending"
            raise ReplayRefused(
                f"stage {earlier.value} of inquiry {anfrage.id} has not succeeded ({status}); "
                f"replay {earlier.value} first"
            )
    for target in targets:
        run = runs.get(target.value)
        if run is not None and run.status == LedgerStatus.RUNNING and run.lease_live:
            raise ReplayRefused(
                f"stage {target.value} of inquiry {anfrage.id} is running (lease until "
                f"{run.lease_expires_at:%Y-%m-%d %H:%M:%S}); wait for it to finish"
            )
    reopen = [
        t.value for t in targets if t.value in runs and runs[t.value].status == LedgerStatus.SUCCESS
    ]
    if reopen and not force:
        raise ReplayRefused(
            f"stage {', '.join(reopen)} of inquiry {anfrage.id} already succeeded; "
            "only a forced replay runs it again",
            remedy="force",
        )
    # The replayed stage rewrites what the later stages computed from: a later stage left
    # 'success' would count as done on output that is gone, and the inquiry would close
    # without a quote. They run again with it (cascade), or the replay is refused.
    stale = [
        later.value
        for later in stage.following
        if later not in targets
        and later.value in runs
        and runs[later.value].status == LedgerStatus.SUCCESS
    ]
    if stale:
        raise ReplayRefused(
            f"stage {', '.join(stale)} of inquiry {anfrage.id} succeeded on the output of "
            f"{stage.value}, which the replay rewrites; they must run again with it",
            remedy="cascade",
        )
    return reopen


def pipeline_stage_replay(
    *,
    tenant_id: int,
    anfrage_id: int,
    stage: Stage | str,
    force: bool = False,
    cascade: bool = False,
    dry_run: bool = False,
    actor: str,
) -> ReplayResult:
    """Run a stage again (with ``cascade``, the stages after it too), audited.

    In one transaction: lock the inquiry's ledger rows in stage order, then decide from
    them — refused (``ReplayRefused``) while an earlier stage has not succeeded, while a
    target stage runs under a live lease, for a successful stage without ``force``, and
    without ``cascade`` while a later stage has succeeded (it would stay ``success`` on
    output the replay rewrites, and the inquiry would close without a quote) —
    and, in new statements, reopen the successful targets (compare-and-set on
    ``success``), reset their resume count and give-up, reopen the inquiry, enqueue the
    stage (EXCLUSIVE key) and write a ``stage.replayed`` audit entry. So the same replay
    run twice at once reopens once and enqueues one job, and a stage whose closing
    transaction commits meanwhile is reopened too. ``dry_run`` writes nothing.
    """
    stage = parse_stage(stage)
    anfrage = anfrage_get(tenant_id=tenant_id, anfrage_id=anfrage_id)
    targets = (stage, *stage.following) if cascade else (stage,)
    with transaction.atomic():
        runs = _lock_runs(anfrage)
        reopen = _refuse(anfrage=anfrage, stage=stage, targets=targets, runs=runs, force=force)
        if dry_run:
            return ReplayResult(
                anfrage_id=anfrage.id,
                stage=stage,
                reopened=tuple(reopen),
                job_id=None,
                enqueued=False,
                dry_run=True,
            )
        params = {
            "tenant_id": anfrage.tenant_id,
            "anfrage_id": anfrage.id,
            "stages": [t.value for t in targets],
        }
        reopened: list[str] = []
        reason = f"{REPLAY_REASON_PREFIX} {actor} at {timezone.now():%Y-%m-%d %H:%M:%S}"
        with connection.cursor() as cursor:
            # A new statement, so a fresh snapshot: it sees every commit the lock waited
            # for; compare-and-set on 'success' all the same.
            reset = [t.value for t in targets if t is not stage or force]
            if reset:
                cursor.execute(
                    QUERIES["replay_reset"],
                    {
                        **params,
                        "stages": reset,
                        "reason": reason,
                    },
                )
                reopened = sorted((row[0] for row in cursor.fetchall()), key=Stage.values.index)
            # A failed target the replay queues reads as waiting too, not as failed.
            cursor.execute(
                QUERIES["replay_mark_waiting"],
                {**params, "reason": reason, "prefix": f"{REPLAY_REASON_PREFIX}%"},
            )
            cursor.execute(QUERIES["replay_clear_resumes"], params)
            cursor.execute(QUERIES["anfrage_reopen"], {"anfrage_id": anfrage.id})
        job = pipeline_stage_enqueue(anfrage=anfrage, stage=stage)
        audit_entry_create(
            tenant_id=anfrage.tenant_id,
            entity_type="anfrage",
            entity_id=anfrage.id,
            action="stage.replayed",
            actor=actor,
            payload={
                "stage": stage.value,
                "force": force,
                "cascade": cascade,
                "reopened": reopened,
                "job_id": job.job_id,
                "enqueued": job.created,
            },
        )
    return ReplayResult(
        anfrage_id=anfrage.id,
        stage=stage,
        reopened=tuple(reopened),
        job_id=job.job_id,
        enqueued=job.created,
        dry_run=False,
    )
