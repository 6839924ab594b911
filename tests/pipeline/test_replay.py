"""Replays (``pipeline/replay.py``): refusals, dry runs, forced and cascading replays,
the same replay twice at once, and replays racing a stage that runs meanwhile.

Fault model — at each step, what can die, stall or race; what must hold; the test:

decide (under the ledger rows' locks)
  - an earlier stage has not succeeded, a target runs under a live lease, a success
    without --force, another tenant: refused, nothing written (test_replay_refusals)
  - a dry run: nothing written (test_dry_run_changes_nothing)
reopen
  - the same replay twice at once: reopened once, one job, both audited
    (test_the_same_replay_twice_at_once_enqueues_once)
  - a later stage's closing transaction (lease lapsed, worker alive) commits while a
    cascading replay reopens: the replay waits for it and reopens it too
    (test_a_cascading_replay_reopens_a_stage_whose_closing_transaction_commits_meanwhile)
  - the replayed stage is reopened while a later stage computes: the later stage's
    result is superseded (test_extract_reopened_meanwhile_supersedes_feasibility), or
    retried on the new input once the replay finished
    (test_extract_replayed_and_finished_meanwhile_makes_feasibility_retry)
  - extract, two stages back, is replayed with --cascade and runs again with feasibility
    before calculate read its input, after it, or while it computes: calculate never
    commits a quote from the old positions; it is retried and prices the new ones
    (test_extract_rerun_two_stages_back_never_lets_calculate_commit_the_old_positions);
    feasibility reopened (without --cascade) while calculate computes supersedes it
    (test_feasibility_reopened_while_calculate_computes_supersedes_calculate)
run again
  - without --cascade only that stage runs, and only when no later stage succeeded on
    the output it rewrites (test_forced_replay_of_the_last_stage_runs_only_that_stage,
    test_a_replay_that_would_leave_later_stages_stale_needs_cascade,
    test_a_replay_of_a_failed_stage_runs_the_later_ones_after_it); with it the later ones
    too (test_cascade_replay_reruns_the_later_stages,
    test_after_the_race_the_chain_finishes_on_the_new_output)
  - a failed stage needs no --force (test_replay_of_a_failed_stage_needs_no_force); a
    stage the resume sweep gave up on gets a fresh budget: see ``test_resume.py``
  - an operator changes prices and replays calculate while a calculate job has read its
    input but not claimed yet: the run prices with the new catalog (it reads the catalog
    after its claim) (test_a_price_change_replayed_before_calculates_claim_is_priced)
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import threading

import pytest
from django.db import connection
from django.utils import timezone

from pipeline import stages
from pipeline.exceptions import AnfrageNotFound, ReplayRefused, StageInputStale, UnknownStage
from pipeline.models import AuditEntry, PipelineRun, Position, Stage
from pipeline.replay import pipeline_stage_replay
from pipeline.stages import LEDGER, StageOutcome, pipeline_stage_run
from tests.conftest import jobs, run_concurrently, wait_for
from tests.pipeline.conftest import in_background, run_stages, submit


def runs(anfrage) -> dict[str, tuple[str, int]]:
    return {r.stage: (r.status, r.attempts) for r in PipelineRun.objects.filter(anfrage=anfrage)}


def drop_jobs() -> None:
    """Forget the jobs the inline stage runs enqueued (no worker consumed them)."""
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")


def test_replay_refusals(tenant, other_tenant):
    anfrage = submit(tenant)
    with pytest.raises(ReplayRefused, match=r"intake of inquiry .* has not succeeded"):
        pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage="extract", actor="test"
        )
    run_stages(anfrage.id)
    with pytest.raises(ReplayRefused, match="only a forced replay runs it again"):
        pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage="extract", actor="test"
        )
    with pytest.raises(UnknownStage, match="intake, extract, feasibility, calculate"):
        pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage="bake", actor="test"
        )
    with pytest.raises(AnfrageNotFound):
        pipeline_stage_replay(
            tenant_id=other_tenant.id,
            anfrage_id=anfrage.id,
            stage="extract",
            force=True,
            actor="test",
        )
    PipelineRun.objects.filter(anfrage=anfrage, stage="calculate").update(
        status="running", lease_expires_at=timezone.now() + datetime.timedelta(minutes=5)
    )
    with pytest.raises(ReplayRefused, match=r"calculate of inquiry .* is running"):
        pipeline_stage_replay(
            tenant_id=tenant.id,
            anfrage_id=anfrage.id,
            stage="extract",
            force=True,
            cascade=True,
            actor="test",
        )
    assert not AuditEntry.objects.filter(action="stage.replayed").exists()


def test_dry_run_changes_nothing(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    job_count = len(jobs())
    result = pipeline_stage_replay(
        tenant_id=tenant.id,
        anfrage_id=anfrage.id,
        stage="extract",
        force=True,
        cascade=True,
        dry_run=True,
        actor="test",
    )
    assert result.reopened == ("extract", "feasibility", "calculate") and result.dry_run
    assert runs(anfrage) == {s.value: ("success", 1) for s in Stage}
    assert len(jobs()) == job_count
    assert not AuditEntry.objects.filter(action="stage.replayed").exists()


def test_forced_replay_of_the_last_stage_runs_only_that_stage(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    drop_jobs()
    result = pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage="calculate", force=True, actor="ops"
    )
    assert result.reopened == ("calculate",) and result.enqueued
    run = PipelineRun.objects.get(anfrage=anfrage, stage="calculate")
    assert run.status == "failed" and "replay requested by ops" in run.error
    assert run_stages(anfrage.id) == ["skipped", "skipped", "skipped", "completed"]
    assert runs(anfrage)["calculate"] == ("success", 2)
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None and anfrage.completed_at is not None
    [entry] = AuditEntry.objects.filter(action="stage.replayed")
    assert entry.actor == "ops"
    assert entry.payload == {
        "stage": "calculate",
        "force": True,
        "cascade": False,
        "reopened": ["calculate"],
        "job_id": result.job_id,
        "enqueued": True,
    }


@pytest.mark.parametrize(
    ("stage", "stale"),
    [
        ("intake", "extract, feasibility, calculate"),
        ("extract", "feasibility, calculate"),
        ("feasibility", "calculate"),
    ],
)
def test_a_replay_that_would_leave_later_stages_stale_needs_cascade(tenant, stage, stale):
    """A forced replay of one stage rewrites the output the later stages computed from;
    left ``success``, they would be skipped as done and the inquiry would close without a
    quote (``complete: true``, ``quote_total: null``). Refused, writing nothing."""
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    drop_jobs()
    with pytest.raises(ReplayRefused, match=f"stage {stale} of inquiry .* succeeded") as refused:
        pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage=stage, force=True, actor="ops"
        )
    assert refused.value.remedy == "cascade"
    assert runs(anfrage) == {s.value: ("success", 1) for s in Stage}
    assert jobs() == []
    assert not AuditEntry.objects.filter(action="stage.replayed").exists()
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None and anfrage.completed_at is not None


def test_a_replay_of_a_failed_stage_runs_the_later_ones_after_it(tenant):
    """Later stages that have not succeeded need no cascade: the replayed stage hands on
    to them, and the inquiry completes with a quote."""
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT))
    claim = LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="feasibility")
    LEDGER.fail(claim, error="boom")
    pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage="extract", force=True, actor="ops"
    )
    assert run_stages(anfrage.id) == ["skipped", "completed", "completed", "completed"]
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None and anfrage.completed_at is not None


def test_cascade_replay_reruns_the_later_stages(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    result = pipeline_stage_replay(
        tenant_id=tenant.id,
        anfrage_id=anfrage.id,
        stage="extract",
        force=True,
        cascade=True,
        actor="ops",
    )
    assert result.reopened == ("extract", "feasibility", "calculate")
    assert run_stages(anfrage.id) == ["skipped", "completed", "completed", "completed"]
    assert runs(anfrage) == {
        "intake": ("success", 1),
        "extract": ("success", 2),
        "feasibility": ("success", 2),
        "calculate": ("success", 2),
    }
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None


def test_replay_of_a_failed_stage_needs_no_force(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE])
    claim = LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="extract")
    LEDGER.fail(claim, error="boom")
    result = pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage="extract", actor="ops"
    )
    assert result.reopened == () and result.job_id is not None


@pytest.mark.django_db(transaction=True)
def test_the_same_replay_twice_at_once_enqueues_once(clean_queue, tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    drop_jobs()
    results = run_concurrently(
        lambda i: pipeline_stage_replay(
            tenant_id=tenant.id,
            anfrage_id=anfrage.id,
            stage="extract",
            force=True,
            cascade=True,
            actor=f"ops-{i}",
        ),
        2,
    )
    assert sum(r.enqueued for r in results) == 1, results
    assert len({r.job_id for r in results}) == 1
    assert sorted(len(r.reopened) for r in results) == [0, 3]
    assert len(jobs(task_name="pipeline.extract")) == 1
    assert AuditEntry.objects.filter(action="stage.replayed").count() == 2


# --- a replay racing a stage that runs meanwhile


def status(anfrage, stage: Stage) -> str:
    return PipelineRun.objects.get(anfrage=anfrage, stage=stage.value).status


@pytest.fixture
def during_feasibility(monkeypatch):
    """Run ``hook`` while feasibility computes (after its claim, before it commits)."""

    def install(hook):
        work = stages._STAGES[Stage.FEASIBILITY]

        def compute(anfrage, inputs):
            result = work.compute(anfrage, inputs)
            hook(anfrage)
            return result

        monkeypatch.setitem(
            stages._STAGES, Stage.FEASIBILITY, dataclasses.replace(work, compute=compute)
        )

    return install


@pytest.mark.django_db(transaction=True)
def test_extract_replayed_and_finished_meanwhile_makes_feasibility_retry(
    tenant, during_feasibility
):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT))

    def replay_extract(anfrage):
        # Without --cascade: the replay is not refused by the running later stage.
        pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage=Stage.EXTRACT, force=True, actor="ops"
        )
        assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT) == "completed"

    during_feasibility(replay_extract)
    with pytest.raises(StageInputStale):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.FEASIBILITY)
    # Nothing of the stale computation landed: the new positions carry no verdicts yet.
    assert status(anfrage, Stage.FEASIBILITY) == "failed"
    assert not Position.objects.filter(anfrage=anfrage, feasible__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_extract_reopened_meanwhile_supersedes_feasibility(tenant, during_feasibility):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT))

    def reopen_extract(anfrage):
        pipeline_stage_replay(
            tenant_id=tenant.id, anfrage_id=anfrage.id, stage=Stage.EXTRACT, force=True, actor="ops"
        )

    during_feasibility(reopen_extract)
    outcome = pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.FEASIBILITY)
    assert outcome is StageOutcome.SUPERSEDED
    assert status(anfrage, Stage.FEASIBILITY) == "failed"
    assert not Position.objects.filter(anfrage=anfrage, feasible__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_after_the_race_the_chain_finishes_on_the_new_output(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    pipeline_stage_replay(
        tenant_id=tenant.id,
        anfrage_id=anfrage.id,
        stage=Stage.EXTRACT,
        force=True,
        cascade=True,
        actor="ops",
    )
    assert {s: status(anfrage, s) for s in Stage} == {
        Stage.INTAKE: "success",
        Stage.EXTRACT: "failed",
        Stage.FEASIBILITY: "failed",
        Stage.CALCULATE: "failed",
    }
    run_stages(anfrage.id, (Stage.EXTRACT, Stage.FEASIBILITY, Stage.CALCULATE))
    assert {status(anfrage, s) for s in Stage} == {"success"}
    assert not Position.objects.filter(anfrage=anfrage, feasible__isnull=True).exists()


def wait_until_blocked_on_a_lock() -> None:
    """Wait until another backend of this database waits for a row lock (the replay)."""

    def blocked() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0] > 0

    wait_for(blocked, timeout=20, message="the replay to wait for the closing transaction")


@pytest.mark.django_db(transaction=True)
def test_a_cascading_replay_reopens_a_stage_whose_closing_transaction_commits_meanwhile(
    clean_queue, tenant, monkeypatch
):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT))
    at_close, release = threading.Event(), threading.Event()
    work = stages._STAGES[Stage.FEASIBILITY]

    def write(anfrage, result):
        # Inside feasibility's closing transaction: extract's row is share-locked, the
        # verdicts are written, success is not committed yet. The closing transaction's
        # statements reach the server together when its pipeline ends: a nested pipeline
        # sends what it holds so far (the BEGIN, the hold, the verdicts), so the server
        # stops the transaction here, before its completion.
        work.write(anfrage, result)
        with connection.connection.pipeline():
            pass
        at_close.set()
        assert release.wait(timeout=30), "the test never released the closing transaction"

    monkeypatch.setitem(stages._STAGES, Stage.FEASIBILITY, dataclasses.replace(work, write=write))
    stage, stage_outcome = in_background(
        lambda: pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.FEASIBILITY)
    )
    assert at_close.wait(timeout=20)
    # Its lease ran out while its worker lived on, so the replay is not refused.
    PipelineRun.objects.filter(anfrage=anfrage, stage="feasibility").update(
        lease_expires_at=timezone.now() - datetime.timedelta(seconds=1)
    )
    replay, replay_outcome = in_background(
        lambda: pipeline_stage_replay(
            tenant_id=tenant.id,
            anfrage_id=anfrage.id,
            stage="extract",
            force=True,
            cascade=True,
            actor="ops",
        )
    )
    wait_until_blocked_on_a_lock()
    release.set()
    stage.join(timeout=30)
    replay.join(timeout=30)

    assert stage_outcome == [StageOutcome.COMPLETED]
    [result] = replay_outcome
    assert not isinstance(result, BaseException), result
    # The feasibility result, computed from the replayed positions, did not survive.
    assert result.reopened == ("extract", "feasibility")
    assert runs(anfrage) == {
        "intake": ("success", 1),
        "extract": ("failed", 1),
        "feasibility": ("failed", 1),
    }
    assert run_stages(anfrage.id) == ["skipped", "completed", "completed", "completed"]
    assert {status for status, _ in runs(anfrage).values()} == {"success"}


# --- extract replayed (two stages back) while calculate reads or computes


def _rerun_from_extract(tenant, anfrage) -> None:
    """In another connection: a cascading replay of extract, then extract and feasibility
    run again to success (new position rows with new verdicts)."""

    def replay_and_run():
        with connection.cursor() as cursor:
            # A calculate computing now has a lapsed lease (its worker stalled), so the
            # replay is not refused; its row stays 'running'.
            cursor.execute(
                "UPDATE pipeline_runs SET lease_expires_at = now() - interval '1 second'"
                " WHERE anfrage_id = %s AND stage = 'calculate' AND status = 'running'",
                [anfrage.id],
            )
        pipeline_stage_replay(
            tenant_id=tenant.id,
            anfrage_id=anfrage.id,
            stage=Stage.EXTRACT,
            force=True,
            cascade=True,
            actor="ops",
        )
        assert run_stages(anfrage.id, (Stage.EXTRACT, Stage.FEASIBILITY)) == [
            "completed",
            "completed",
        ]

    thread, outcome = in_background(replay_and_run)
    thread.join()
    assert outcome == [None], outcome


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("when", ["before_input", "after_input", "while_computing"])
def test_extract_rerun_two_stages_back_never_lets_calculate_commit_the_old_positions(
    tenant, monkeypatch, when
):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY))
    drop_jobs()
    old_ids = set(Position.objects.filter(anfrage=anfrage).values_list("id", flat=True))
    work = stages._STAGES[Stage.CALCULATE]

    def prepare(anfrage_):
        if when == "before_input":
            _rerun_from_extract(tenant, anfrage)
        inputs = work.prepare(anfrage_)
        if when == "after_input":
            _rerun_from_extract(tenant, anfrage)
        return inputs

    def compute(anfrage_, inputs):
        result = work.compute(anfrage_, inputs)
        if when == "while_computing":
            _rerun_from_extract(tenant, anfrage)
        return result

    monkeypatch.setitem(
        stages._STAGES,
        Stage.CALCULATE,
        dataclasses.replace(work, prepare=prepare, compute=compute),
    )
    if when == "before_input":
        # The token was read before the replay, the input after it: a false alarm at
        # worst (the input is the new one), never a result from the old positions.
        with contextlib.suppress(StageInputStale):
            pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE)
    else:
        with pytest.raises(StageInputStale):
            pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE)
        anfrage.refresh_from_db()
        assert (anfrage.quote_total, anfrage.completed_at) == (None, None)
        assert all(p.total is None for p in Position.objects.filter(anfrage=anfrage))
    monkeypatch.setitem(stages._STAGES, Stage.CALCULATE, work)
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE) in (
        "completed",
        "skipped",
    )
    anfrage.refresh_from_db()
    positions = list(Position.objects.filter(anfrage=anfrage))
    assert not old_ids & {p.id for p in positions}
    assert all(p.feasible is not None for p in positions)
    assert anfrage.quote_total == sum(p.total for p in positions if p.total is not None)
    assert anfrage.completed_at is not None


@pytest.mark.django_db(transaction=True)
def test_feasibility_reopened_while_calculate_computes_supersedes_calculate(tenant, monkeypatch):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY))
    work = stages._STAGES[Stage.CALCULATE]

    def compute(anfrage_, inputs):
        result = work.compute(anfrage_, inputs)
        # Without --cascade: calculate has not succeeded, so the replay is not refused.
        thread, outcome = in_background(
            lambda: pipeline_stage_replay(
                tenant_id=tenant.id,
                anfrage_id=anfrage.id,
                stage=Stage.FEASIBILITY,
                force=True,
                actor="ops",
            )
        )
        thread.join()
        assert outcome and outcome[0].reopened == ("feasibility",), outcome
        return result

    monkeypatch.setitem(stages._STAGES, Stage.CALCULATE, dataclasses.replace(work, compute=compute))
    outcome = pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE)
    assert outcome is StageOutcome.SUPERSEDED
    anfrage.refresh_from_db()
    assert (anfrage.quote_total, anfrage.completed_at) == (None, None)
    assert not Position.objects.filter(anfrage=anfrage, total__isnull=False).exists()
    monkeypatch.setitem(stages._STAGES, Stage.CALCULATE, work)
    assert run_stages(anfrage.id, (Stage.FEASIBILITY, Stage.CALCULATE)) == ["completed"] * 2
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None and anfrage.completed_at is not None


def test_a_price_change_replayed_before_calculates_claim_is_priced(tenant, monkeypatch):
    """The replay's enqueue is merged into the calculate job already running (its
    EXCLUSIVE key), so that run must price with the catalog as it is after its claim."""
    from decimal import Decimal

    from pipeline.models import Anfrage, Catalog, CatalogItem, Unit
    from queueing.ledger import Ledger

    catalog = Catalog.objects.create(
        tenant=tenant, name="Acme", currency="EUR", materials={"S235": ["steel"]}
    )
    CatalogItem.objects.create(
        catalog=catalog,
        code="beam",
        name="Beam",
        keywords=["beam"],
        materials=["S235"],
        unit=Unit.PIECES,
        min_quantity=1,
        price_breaks=[["1", "100.00"]],
    )
    anfrage = submit(tenant, {"a.txt": "12 pcs beam HEA 200\n"})
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY, Stage.CALCULATE))
    claim = Ledger.claim

    def reprice_then_claim(self, **key):
        # The operator, between calculate's read of its input and its claim.
        CatalogItem.objects.filter(code="beam").update(price_breaks=[["1", "80.00"]])
        pipeline_stage_replay(
            tenant_id=tenant.id,
            anfrage_id=anfrage.id,
            stage=Stage.CALCULATE,
            force=True,
            actor="operator",
        )
        return claim(self, **key)

    monkeypatch.setattr(Ledger, "claim", reprice_then_claim)
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE) == "completed"
    assert Anfrage.objects.get(pk=anfrage.id).quote_total == Decimal("80.00") * 12
