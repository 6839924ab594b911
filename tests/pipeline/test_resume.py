"""The ``pipeline_resume`` sweep (``pipeline/resume.py``) and the set of open inquiries.

Stage jobs are run in this process, one attempt each, as a worker without retries would
(``work_off``); a job is lost by cancelling or deleting it. Time moves by back-dating the
inquiry's timestamps (``idle``), never by sleeping.

Fault model — at each step, what can die, stall or race; what must hold; the test:

a stage's job
  - fails for good (retries spent, or an error no retry fixes): resumed once idle past the
    grace, and the pipeline completes
    (test_a_stage_whose_job_failed_for_good_is_resumed_and_the_pipeline_completes)
  - is cancelled or deleted before any claim (no ledger row), or vanishes with its dead
    worker (row ``running``, lease lapsed): resumed; a missing row is created ``failed``,
    saying the job was lost (test_a_stage_whose_job_vanished_is_resumed)
  - is alive — waiting, a retry scheduled, running, running past its lease: never
    duplicated, nothing written (test_a_live_job_is_never_duplicated)
  - keeps failing after each resume: after PIPELINE_MAX_RESUMES the row is ``failed``
    with a reason saying what to do, audited, shown, never resumed again; a replay resets
    it (test_the_sweep_gives_up_after_max_resumes_until_a_replay); with
    PIPELINE_MAX_RESUMES=0 it gives up at once, a lost job included
    (test_without_resumes_a_lost_job_is_given_up_at_once)
the sweep
  - has nothing to do: one SELECT (after turning JIT off for it), no enqueue, no write
    (test_with_nothing_to_do_the_sweep_issues_one_select_and_no_enqueue)
  - runs twice at once (two workers, an overlapping deploy): one job per stage, one resume
    counted (test_two_sweeps_at_once_enqueue_one_job_per_stage)
  - runs beside a replay of the same stage: one job, no deadlock
    (test_a_sweep_beside_a_replay_enqueues_one_job)
  - fails on one row: that row's job and count roll back together, the batch goes on,
    the next run resumes it (test_a_failing_row_rolls_back_alone)
the set of open inquiries (``completed_at``)
  - calculate's closing transaction closes it; a replay reopens it; one left open with
    every stage ``success`` is closed by the sweep
    (test_an_inquiry_is_open_exactly_while_a_stage_is_left_to_run)
  - calculate closes while an earlier stage was reopened: it stays open
    (test_calculate_leaves_the_inquiry_open_when_an_earlier_stage_was_reopened)
  - existing inquiries at the migration: the complete ones are closed
    (test_the_migration_closes_complete_inquiries_only)
liveness
  - a stopped stage is flagged by the LIVENESS check once past grace + one period, and no
    longer once the sweep resumed it (test_the_liveness_check_flags_a_stopped_stage_until_resumed)
"""

from __future__ import annotations

import dataclasses
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test.utils import CaptureQueriesContext

from pipeline import resume, stages
from pipeline.models import Anfrage, AuditEntry, PipelineRun, Stage
from pipeline.replay import pipeline_stage_replay
from pipeline.stages import LEDGER, pipeline_stage_run
from queueing.sweeps import SweepResult, run_sweep
from tests.conftest import jobs, run_concurrently
from tests.invariants import LIVENESS
from tests.pipeline.conftest import run_stages, submit

GRACE = 60
STAGE_TASKS = {f"pipeline.{stage.value}" for stage in Stage}
LIVENESS_CHECK = (
    "11f. every stage that can run has a live job or is due for the pipeline_resume sweep"
)


@pytest.fixture(autouse=True)
def resume_settings(settings):
    settings.PIPELINE_RESUME_GRACE_SECONDS = GRACE
    settings.PIPELINE_MAX_RESUMES = 3


def sweep() -> SweepResult:
    return run_sweep("pipeline_resume")


def execute(sql: str, params=None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def idle(anfrage, seconds: int = 3600) -> None:
    """Time travel: everything that happened to the inquiry happened ``seconds`` earlier."""
    shift = {"id": anfrage.id, "seconds": seconds}
    execute(
        "UPDATE pipeline_runs SET started_at = started_at - %(seconds)s * interval '1 second',"
        " finished_at = finished_at - %(seconds)s * interval '1 second',"
        " lease_expires_at = lease_expires_at - %(seconds)s * interval '1 second'"
        " WHERE anfrage_id = %(id)s",
        shift,
    )
    execute(
        "UPDATE anfragen SET created_at = created_at - %(seconds)s * interval '1 second'"
        " WHERE id = %(id)s",
        shift,
    )


def stage_jobs(anfrage, *statuses: str) -> list[dict]:
    return [
        j
        for j in jobs()
        if j["task_name"] in STAGE_TASKS
        and j["args"].get("anfrage_id") == anfrage.id
        and (not statuses or j["status"] in statuses)
    ]


def set_job_status(job_id: int, status: str) -> None:
    execute(
        "UPDATE procrastinate_jobs SET status = %s, worker_id = NULL WHERE id = %s",
        [status, job_id],
    )


def work_off(anfrage, *, until: str | None = None) -> list[str]:
    """Run the inquiry's waiting stage jobs here, oldest first (up to stage ``until``),
    as a worker without retries would: a stage that raises fails its job for good."""
    done = []
    while todo := stage_jobs(anfrage, "todo"):
        job = todo[0]
        stage = job["task_name"].removeprefix("pipeline.")
        if until is not None and Stage.values.index(stage) > Stage.values.index(until):
            break
        try:
            outcome, status = pipeline_stage_run(anfrage_id=anfrage.id, stage=stage), "succeeded"
        except Exception:
            outcome, status = "raised", "failed"
        set_job_status(job["id"], status)
        done.append(f"{stage}:{outcome}")
    return done


def run_of(anfrage, stage: str) -> PipelineRun:
    return PipelineRun.objects.get(anfrage=anfrage, stage=stage)


def audit(action: str) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(action=action).order_by("id"))


def stopped_after_intake(tenant, count: int) -> list[Anfrage]:
    """``count`` inquiries whose intake succeeded and whose extract job was lost an hour
    ago."""
    stopped = [submit(tenant) for _ in range(count)]
    for anfrage in stopped:
        run_stages(anfrage.id, [Stage.INTAKE])
    execute("DELETE FROM procrastinate_jobs")
    for anfrage in stopped:
        idle(anfrage)
    return stopped


# --- resuming


def test_a_stage_whose_job_failed_for_good_is_resumed_and_the_pipeline_completes(
    tenant, scripted_extractor
):
    anfrage = submit(tenant)
    scripted_extractor.fail_with = RuntimeError("parser exploded")
    assert work_off(anfrage) == ["intake:completed", "extract:raised"]
    assert sweep().selected == 0, "within the grace period nothing is resumed"

    idle(anfrage)
    result = sweep()
    assert (result.selected, result.changed, result.failed) == (1, 1, 0)
    run = run_of(anfrage, "extract")
    assert (run.status, run.resumes, run.error) == ("failed", 1, "RuntimeError: parser exploded")
    [job] = stage_jobs(anfrage, "todo")
    assert job["task_name"] == "pipeline.extract"
    assert job["queueing_lock"] == f"exclusive/extract:acme:{anfrage.id}"
    [entry] = audit("stage.resumed")
    assert (entry.actor, entry.entity_id) == ("sweep:pipeline_resume", anfrage.id)
    assert entry.payload == {
        "stage": "extract",
        "resumes": 1,
        "job_id": job["id"],
        "lost_job": False,
    }

    scripted_extractor.fail_with = None
    assert work_off(anfrage) == [
        "extract:completed",
        "feasibility:completed",
        "calculate:completed",
    ]
    anfrage.refresh_from_db()
    assert anfrage.completed_at is not None and anfrage.quote_total is not None
    idle(anfrage)
    assert sweep().selected == 0


@pytest.mark.parametrize("loss", ["cancelled", "deleted", "worker died"])
def test_a_stage_whose_job_vanished_is_resumed(tenant, loss):
    anfrage = submit(tenant)
    assert work_off(anfrage, until="intake") == ["intake:completed"]
    [lost] = stage_jobs(anfrage, "todo")
    if loss == "worker died":
        # Its worker claimed the stage and died; the job is gone with it.
        assert LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="extract").claimed
        execute("DELETE FROM procrastinate_jobs WHERE id = %s", [lost["id"]])
    elif loss == "deleted":
        execute("DELETE FROM procrastinate_jobs WHERE id = %s", [lost["id"]])
    else:
        set_job_status(lost["id"], "cancelled")
    idle(anfrage)

    assert sweep().changed == 1
    run = run_of(anfrage, "extract")
    if loss == "worker died":
        assert (run.status, run.attempts, run.resumes) == ("running", 1, 1)
    else:
        assert (run.status, run.attempts, run.resumes) == ("failed", 0, 1)
        assert run.error == resume.LOST_JOB_ERROR
    assert [j["task_name"] for j in stage_jobs(anfrage, "todo")] == ["pipeline.extract"]
    assert work_off(anfrage) == [
        "extract:completed",
        "feasibility:completed",
        "calculate:completed",
    ]
    assert run_of(anfrage, "extract").attempts == (2 if loss == "worker died" else 1)
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is not None


@pytest.mark.parametrize(
    "alive", ["waiting", "retry scheduled", "running", "running past its lease"]
)
def test_a_live_job_is_never_duplicated(tenant, alive):
    anfrage = submit(tenant)
    work_off(anfrage, until="intake")
    [job] = stage_jobs(anfrage, "todo")
    if alive == "retry scheduled":
        claim = LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="extract")
        LEDGER.fail(claim, error="TimeoutError: the first attempt timed out")
        execute(
            "UPDATE procrastinate_jobs SET scheduled_at = now() + interval '1 hour' WHERE id = %s",
            [job["id"]],
        )
    elif alive.startswith("running"):
        assert LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="extract").claimed
        set_job_status(job["id"], "doing")
    # Idle for an hour: a lease of 300 s has lapsed too, unless it was renewed.
    idle(anfrage)
    if alive == "running":
        execute(
            "UPDATE pipeline_runs SET lease_expires_at = now() + interval '5 minutes'"
            " WHERE anfrage_id = %s",
            [anfrage.id],
        )
    before = (jobs(), list(PipelineRun.objects.values()))

    result = sweep()
    assert (result.selected, result.changed, result.notes) == (0, 0, {})
    assert (jobs(), list(PipelineRun.objects.values())) == before
    assert not audit("stage.resumed")


def test_with_nothing_to_do_the_sweep_issues_one_select_and_no_enqueue(
    tenant, scripted_extractor, settings
):
    settings.PIPELINE_MAX_RESUMES = 0
    complete = submit(tenant, title="complete")
    work_off(complete)
    waiting = submit(tenant, title="waiting")
    work_off(waiting, until="intake")
    given_up = submit(tenant, title="given up")
    scripted_extractor.fail_with = RuntimeError("parser exploded")
    work_off(given_up)
    idle(given_up)
    assert sweep().notes == {"gave_up": 1}
    recent = submit(tenant, title="failed a moment ago")
    work_off(recent)
    for anfrage in (complete, waiting, given_up):
        idle(anfrage)

    with CaptureQueriesContext(connection) as queries:
        result = sweep()
    assert (result.selected, result.changed, result.failed) == (0, 0, 0)
    # Savepoints are the test's own transaction nesting (one per atomic block); the
    # framework bounds every sweep transaction (statement and idle timeouts).
    [no_jit, select] = [
        q["sql"]
        for q in queries.captured_queries
        if "SAVEPOINT" not in q["sql"].upper() and "set_config" not in q["sql"]
    ]
    assert no_jit == "SET LOCAL jit = off;"
    assert select.lstrip().startswith("SELECT") and "procrastinate_jobs" in select


@pytest.mark.parametrize("max_resumes", [1, 2])
def test_the_sweep_gives_up_after_max_resumes_until_a_replay(
    tenant, scripted_extractor, settings, max_resumes
):
    settings.PIPELINE_MAX_RESUMES = max_resumes
    anfrage = submit(tenant)
    scripted_extractor.fail_with = RuntimeError("parser exploded")
    assert work_off(anfrage) == ["intake:completed", "extract:raised"]
    for resumed in range(1, max_resumes + 1):
        idle(anfrage)
        assert sweep().changed == 1
        assert run_of(anfrage, "extract").resumes == resumed
        assert work_off(anfrage) == ["extract:raised"]

    idle(anfrage)
    result = sweep()
    assert (result.changed, result.notes) == (0, {"gave_up": 1})
    run = run_of(anfrage, "extract")
    assert run.status == "failed" and run.gave_up_at is not None
    assert run.display_status == "failed (gave up)"
    assert run.error == (
        f"gave up after {max_resumes} resumes; it runs again when an operator replays it; "
        "last error: RuntimeError: parser exploded"
    )
    [entry] = audit("stage.gave_up")
    assert entry.payload == {
        "stage": "extract",
        "resumes": max_resumes,
        "last_error": "RuntimeError: parser exploded",
    }
    assert not stage_jobs(anfrage, "todo", "doing")

    # Never resumed again, however long it waits.
    idle(anfrage)
    assert sweep().selected == 0
    assert len(audit("stage.gave_up")) == 1 and not stage_jobs(anfrage, "todo", "doing")
    out = StringIO()
    call_command("pipeline_status", "--anfrage", str(anfrage.id), stdout=out)
    assert "failed (gave up)" in out.getvalue()
    assert f"replay_stage --tenant acme --anfrage {anfrage.id} --stage extract" in out.getvalue()
    out = StringIO()
    call_command("pipeline_status", stdout=out)
    assert "failed (gave up)" in out.getvalue()

    # An operator's replay gives it a fresh budget; the sweep resumes it again.
    result = pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage="extract", actor="ops"
    )
    run = run_of(anfrage, "extract")
    assert result.enqueued and (run.resumes, run.gave_up_at) == (0, None)
    execute("DELETE FROM procrastinate_jobs WHERE id = %s", [result.job_id])
    idle(anfrage)
    assert sweep().changed == 1
    assert run_of(anfrage, "extract").resumes == 1


def test_without_resumes_a_lost_job_is_given_up_at_once(tenant, settings):
    settings.PIPELINE_MAX_RESUMES = 0
    [anfrage] = stopped_after_intake(tenant, 1)
    assert sweep().notes == {"gave_up": 1}
    run = run_of(anfrage, "extract")
    assert (run.status, run.resumes, run.display_status) == ("failed", 0, "failed (gave up)")
    assert run.error.startswith("gave up after 0 resumes; ")
    assert run.error.endswith("last error: its job was lost before any worker claimed it")
    assert not stage_jobs(anfrage) and len(audit("stage.gave_up")) == 1


def test_a_failing_row_rolls_back_alone(tenant, monkeypatch):
    stopped = stopped_after_intake(tenant, 3)
    real_audit = resume.audit_entry_create

    def audit_failing_once(**kwargs):
        if kwargs["entity_id"] == stopped[1].id and kwargs["action"] == "stage.resumed":
            raise RuntimeError("the audit log is full")
        return real_audit(**kwargs)

    monkeypatch.setattr(resume, "audit_entry_create", audit_failing_once)
    result = sweep()
    assert (result.selected, result.changed, result.failed) == (3, 2, 1)
    assert (
        not stage_jobs(stopped[1])
        and not PipelineRun.objects.filter(anfrage=stopped[1], stage="extract").exists()
    )
    monkeypatch.setattr(resume, "audit_entry_create", real_audit)
    assert sweep().changed == 1
    for anfrage in stopped:
        assert [j["task_name"] for j in stage_jobs(anfrage, "todo")] == ["pipeline.extract"]
        assert run_of(anfrage, "extract").resumes == 1


# --- concurrency (committed data, real concurrent connections)


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_enqueue_one_job_per_stage(clean_queue, tenant):
    stopped = stopped_after_intake(tenant, 6)

    results = run_concurrently(lambda i: sweep(), 2)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sum(r.changed for r in results) == 6, results
    for anfrage in stopped:
        assert len(stage_jobs(anfrage, "todo")) == 1
        assert run_of(anfrage, "extract").resumes == 1
    assert len(audit("stage.resumed")) == 6


@pytest.mark.django_db(transaction=True)
def test_a_sweep_beside_a_replay_enqueues_one_job(clean_queue, tenant, scripted_extractor):
    anfrage = submit(tenant)
    scripted_extractor.fail_with = RuntimeError("parser exploded")
    work_off(anfrage)
    idle(anfrage)

    def sweep_or_replay(i: int):
        if i == 0:
            return sweep()
        return pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage="extract", actor="ops"
        )

    results = run_concurrently(sweep_or_replay, 2)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(stage_jobs(anfrage, "todo")) == 1
    assert results[0].changed + results[1].enqueued == 1, results
    # A resume is counted only when the sweep made it; a replay that lands after the sweep
    # resets the count (as every replay does), its enqueue finding the sweep's job.
    assert run_of(anfrage, "extract").resumes <= results[0].changed


# --- the set of open inquiries


def test_an_inquiry_is_open_exactly_while_a_stage_is_left_to_run(tenant):
    anfrage = submit(tenant)
    work_off(anfrage)
    anfrage.refresh_from_db()
    assert anfrage.completed_at is not None

    pipeline_stage_replay(
        tenant_id=tenant.id,
        anfrage_id=anfrage.id,
        stage="feasibility",
        force=True,
        cascade=True,
        actor="ops",
    )
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is None
    assert work_off(anfrage) == ["feasibility:completed", "calculate:completed"]
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is not None

    # The last stage alone: calculate closes the inquiry again with its quote.
    pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage="calculate", force=True, actor="ops"
    )
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is None
    assert work_off(anfrage) == ["calculate:completed"]
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is not None

    # An inquiry left open with every stage 'success' (a crash between the stages'
    # commits, or rows from before this rule) is closed by the sweep.
    Anfrage.objects.filter(pk=anfrage.id).update(completed_at=None)
    assert sweep().notes == {"closed": 1}
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is not None
    assert sweep().selected == 0


def test_calculate_leaves_the_inquiry_open_when_an_earlier_stage_was_reopened(tenant, monkeypatch):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY))
    work = stages._STAGES[Stage.CALCULATE]

    def compute(anfrage, inputs):
        # Meanwhile extract is reopened (a replay's reset; a replay itself is refused
        # while feasibility stands on extract's output).
        PipelineRun.objects.filter(anfrage_id=anfrage.id, stage="extract").update(status="failed")
        return work.compute(anfrage, inputs)

    monkeypatch.setitem(stages._STAGES, Stage.CALCULATE, dataclasses.replace(work, compute=compute))
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE) == "completed"
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None and anfrage.completed_at is None
    assert run_of(anfrage, "extract").status == "failed"


@pytest.mark.django_db(transaction=True)
def test_the_migration_closes_complete_inquiries_only(clean_queue, tenant):
    complete = submit(tenant, title="complete")
    run_stages(complete.id)
    open_ = submit(tenant, title="open")
    run_stages(open_.id, [Stage.INTAKE])
    executor = MigrationExecutor(connection)
    executor.migrate([("pipeline", "0001_initial")])
    executor.loader.build_graph()
    try:
        executor.migrate([("pipeline", "0002_resume_sweep")])
        # Only the columns 0002 has (a later migration adds ledger columns).
        finished = (
            PipelineRun.objects.filter(anfrage=complete, stage="calculate")
            .values_list("finished_at", flat=True)
            .get()
        )
        assert Anfrage.objects.get(pk=complete.id).completed_at == finished
        assert Anfrage.objects.get(pk=open_.id).completed_at is None
    finally:
        # Back to the latest schema: later tests in this process (and /readyz's
        # migration check) need every migration applied.
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


# --- liveness


def liveness_violations(due_seconds: int) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(LIVENESS[LIVENESS_CHECK], {"pipeline_resume_due_seconds": due_seconds})
        return cursor.fetchall()


def test_the_liveness_check_flags_a_stopped_stage_until_resumed(tenant, scripted_extractor):
    due = GRACE + resume.RESUME_PERIOD_SECONDS
    anfrage = submit(tenant)
    scripted_extractor.fail_with = RuntimeError("parser exploded")
    work_off(anfrage)
    assert liveness_violations(due) == [], "within grace + one period it is not overdue"
    idle(anfrage)
    assert liveness_violations(due) == [(anfrage.id, "extract")]
    sweep()
    assert liveness_violations(due) == []
    # A stage the sweep gave up on waits for an operator, visibly: not a liveness breach.
    for _ in range(3):
        work_off(anfrage)
        idle(anfrage)
        sweep()
    assert run_of(anfrage, "extract").gave_up_at is not None
    assert liveness_violations(due) == []
