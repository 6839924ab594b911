"""Resuming stopped pipelines: the service behind the ``pipeline_resume`` sweep.

A stage whose earlier stages succeeded, that is not ``success`` and that has no waiting or
running job — its job failed for good, was cancelled or deleted, or vanished with a dead
worker — would otherwise wait for an operator. The sweep (every
``RESUME_PERIOD_SECONDS``) picks such stages of open inquiries once they have been idle
for ``PIPELINE_RESUME_GRACE_SECONDS`` and, per stage:

* re-enqueues it under its EXCLUSIVE key (``pipeline_stage_enqueue``); only when a job was
  created does it count one more ``resumes`` on the ledger row (creating a ``failed`` row
  that says the job was lost when there was none) and write a ``stage.resumed`` audit
  entry — so two sweeps at once, or a sweep beside a replay, enqueue one job and count
  one resume;
* after ``PIPELINE_MAX_RESUMES`` resumes it gives up instead: the row becomes ``failed``
  with a reason that says what to do, ``gave_up_at`` is set, a ``stage.gave_up`` audit
  entry is written, and the sweep never picks the stage again until an operator's
  replay (which resets ``resumes`` and ``gave_up_at``).

It also closes open inquiries whose stages all succeeded (after a replay without
``--cascade``), so the set it reads stays the work in flight.
"""

from __future__ import annotations

import enum
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.transaction import TransactionManagementError

from pipeline.audit import audit_entry_create
from pipeline.models import Anfrage, Stage
from pipeline.queries import QUERIES
from pipeline.stages import STAGE_KEY, pipeline_stage_enqueue
from queueing.enqueue import Policy, queueing_lock_for

#: The sweep's period; its cron is derived from it.
RESUME_PERIOD_SECONDS = 30
RESUME_ACTOR = "sweep:pipeline_resume"
LOST_JOB = "its job was lost before any worker claimed it"
LOST_JOB_ERROR = f"{LOST_JOB}; resumed by the pipeline_resume sweep"


class ResumeOutcome(enum.StrEnum):
    RESUMED = "resumed"
    GAVE_UP = "gave_up"
    CLOSED = "closed"
    #: Its ledger row is locked (a replay or a claim is at work): left for the next run.
    BUSY = "busy"
    #: A job of its key appeared meanwhile: nothing to do.
    ALREADY_QUEUED = "already_queued"
    #: It no longer qualifies (it moved on since it was selected).
    NOTHING = "nothing"


def max_resumes() -> int:
    return int(settings.PIPELINE_MAX_RESUMES)


def _stage_lock_template() -> str:
    """The queueing lock of a stage job with markers for its parts, built by the key's
    one builder; the SQL fills in each row's stage, tenant slug and inquiry id (none of
    which can hold ``@``)."""
    key = STAGE_KEY.build(stage="@stage@", tenant="@tenant@", anfrage="@anfrage@")
    return queueing_lock_for(key, Policy.EXCLUSIVE)


def candidate_params(*, grace_seconds: int, anfrage_id: int | None = None) -> dict[str, Any]:
    """Parameters of the ``resume_candidates`` statement (the sweep adds ``limit``)."""
    return {
        "stages": Stage.values,
        "grace_seconds": grace_seconds,
        "lock_template": _stage_lock_template(),
        "anfrage_id": anfrage_id,
    }


def give_up_reason(*, resumes: int, error: str) -> str:
    reason = f"gave up after {resumes} resumes; it runs again when an operator replays it"
    return f"{reason}; last error: {error}" if error else reason


def anfrage_resume(*, anfrage_id: int, grace_seconds: int) -> ResumeOutcome:
    """Resume, give up on or close one selected inquiry (see the module docstring).

    Runs inside the sweep's transaction, which holds the inquiry's row (``FOR NO KEY
    UPDATE``), so replays and the stages' closing writes of this inquiry wait for it. It
    re-selects the inquiry in a fresh statement, locks the stage's ledger row without
    waiting (``BUSY`` when someone holds it), and writes by compare-and-set; the
    enqueue deduplicates on the stage's EXCLUSIVE key. Idempotent: run again, it finds
    the new job and does nothing.
    """
    if not connection.in_atomic_block:
        raise TransactionManagementError("anfrage_resume runs inside the sweep's transaction")
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["resume_candidates"],
            {**candidate_params(grace_seconds=grace_seconds, anfrage_id=anfrage_id), "limit": 1},
        )
        row = cursor.fetchone()
        if row is None:
            return ResumeOutcome.NOTHING
        _, tenant_id, stage_value, run_id, resumes, error = row
        if stage_value is None:
            cursor.execute(
                QUERIES["anfrage_close"], {"anfrage_id": anfrage_id, "stages": Stage.values}
            )
            return ResumeOutcome.CLOSED if cursor.fetchone() else ResumeOutcome.NOTHING
        if run_id is not None:
            cursor.execute(QUERIES["resume_lock_run"], {"run_id": run_id})
            locked = cursor.fetchone()
            if locked is None:
                return ResumeOutcome.BUSY
            resumes, error = locked
        if resumes >= max_resumes():
            return _give_up(
                cursor,
                tenant_id=tenant_id,
                anfrage_id=anfrage_id,
                stage=stage_value,
                resumes=resumes,
                error=error if run_id is not None else LOST_JOB,
            )
    anfrage = Anfrage.objects.select_related("tenant").get(pk=anfrage_id)
    job = pipeline_stage_enqueue(anfrage=anfrage, stage=Stage(stage_value))
    if not job.created:
        return ResumeOutcome.ALREADY_QUEUED
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["resume_record"],
            {
                "tenant_id": tenant_id,
                "anfrage_id": anfrage_id,
                "stage": stage_value,
                "error": LOST_JOB_ERROR,
            },
        )
        counted = cursor.fetchone()
    audit_entry_create(
        tenant_id=tenant_id,
        entity_type="anfrage",
        entity_id=anfrage_id,
        action="stage.resumed",
        actor=RESUME_ACTOR,
        payload={
            "stage": stage_value,
            "resumes": counted[0] if counted else resumes,
            "job_id": job.job_id,
            "lost_job": run_id is None,
        },
    )
    return ResumeOutcome.RESUMED


def _give_up(
    cursor, *, tenant_id: int, anfrage_id: int, stage: str, resumes: int, error: str
) -> ResumeOutcome:
    cursor.execute(
        QUERIES["resume_give_up"],
        {
            "tenant_id": tenant_id,
            "anfrage_id": anfrage_id,
            "stage": stage,
            "error": give_up_reason(resumes=resumes, error=error),
        },
    )
    if cursor.fetchone() is None:
        return ResumeOutcome.NOTHING
    audit_entry_create(
        tenant_id=tenant_id,
        entity_type="anfrage",
        entity_id=anfrage_id,
        action="stage.gave_up",
        actor=RESUME_ACTOR,
        payload={"stage": stage, "resumes": resumes, "last_error": error},
    )
    return ResumeOutcome.GAVE_UP
