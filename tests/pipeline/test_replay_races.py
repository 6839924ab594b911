"""A replay racing a later stage: the later stage never commits a result computed from
output the replay is replacing."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline import services
from pipeline.exceptions import StageInputStale
from pipeline.models import PipelineRun, Position, Stage
from pipeline.services import StageOutcome, pipeline_stage_replay, pipeline_stage_run
from tests.pipeline.conftest import run_stages, submit

pytestmark = pytest.mark.django_db(transaction=True)


def status(anfrage, stage: Stage) -> str:
    return PipelineRun.objects.get(anfrage=anfrage, stage=stage.value).status


@pytest.fixture
def during_feasibility(monkeypatch):
    """Run ``hook`` while feasibility computes (after its claim, before it commits)."""

    def install(hook):
        work = services._STAGES[Stage.FEASIBILITY]

        def compute(anfrage, inputs):
            result = work.compute(anfrage, inputs)
            hook(anfrage)
            return result

        monkeypatch.setitem(
            services._STAGES, Stage.FEASIBILITY, dataclasses.replace(work, compute=compute)
        )

    return install


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
