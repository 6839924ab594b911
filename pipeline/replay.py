"""Replays: an operator runs a stage again (with ``cascade``, the stages after it too).

A replay is audited and happens in one transaction: it reopens the successful target
stages (compare-and-set on ``success``), enqueues the stage under its EXCLUSIVE key and
writes a ``stage.replayed`` audit entry.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from pipeline.exceptions import ReplayRefused
from pipeline.models import Stage
from pipeline.queries import QUERIES
from pipeline.selectors import anfrage_get, parse_stage
from pipeline.services import audit_entry_create, pipeline_stage_enqueue
from queueing.ledger import LedgerStatus


@dataclass(frozen=True, kw_only=True)
class ReplayResult:
    anfrage_id: int
    stage: Stage
    reopened: tuple[str, ...]
    job_id: int | None
    enqueued: bool
    dry_run: bool


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

    Refused (``ReplayRefused``) while an earlier stage has not succeeded, while a target
    stage runs under a live lease, and for a successful stage without ``force``. In one
    transaction: reopen the successful targets (compare-and-set on ``success``), enqueue the
    stage (EXCLUSIVE key) and write a ``stage.replayed`` audit entry; so the same replay
    run twice at once reopens once and enqueues one job. ``dry_run`` writes nothing.
    """
    stage = parse_stage(stage)
    anfrage = anfrage_get(tenant_id=tenant_id, anfrage_id=anfrage_id)
    runs = {run.stage: run for run in anfrage.runs.all()}
    for earlier in stage.previous:
        run = runs.get(earlier.value)
        if run is None or run.status != LedgerStatus.SUCCESS:
            status = run.status if run else "pending"
            raise ReplayRefused(
                f"stage {earlier.value} of inquiry {anfrage.id} has not succeeded ({status}); "
                f"replay {earlier.value} first"
            )
    targets = (stage, *stage.following) if cascade else (stage,)
    now = timezone.now()
    for target in targets:
        run = runs.get(target.value)
        if (
            run is not None
            and run.status == LedgerStatus.RUNNING
            and run.lease_expires_at is not None
            and run.lease_expires_at > now
        ):
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
            "pass --force to run it again"
        )
    if dry_run:
        return ReplayResult(
            anfrage_id=anfrage.id,
            stage=stage,
            reopened=tuple(reopen),
            job_id=None,
            enqueued=False,
            dry_run=True,
        )
    # Reset by compare-and-set at write time, not from the read above: a later stage that
    # succeeded since the read is reopened too (with --cascade), so it cannot keep a result
    # computed from the output being replayed.
    reset = [t.value for t in targets if t is not stage or force]
    with transaction.atomic():
        reopened: list[str] = []
        if reset:
            with connection.cursor() as cursor:
                cursor.execute(
                    QUERIES["replay_reset"],
                    {
                        "tenant_id": anfrage.tenant_id,
                        "anfrage_id": anfrage.id,
                        "stages": reset,
                        "reason": f"replay requested by {actor} at {now:%Y-%m-%d %H:%M:%S}",
                    },
                )
                reopened = sorted(
                    (row[0] for row in cursor.fetchall()), key=[s.value for s in Stage].index
                )
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
