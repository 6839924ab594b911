"""A stage's own work is lean on the wire: each stage of an inquiry, as ``pipeline_stage_run``
runs it, waits on at most the round trips pinned here (counted between the Django
connection and the server by ``bench.wire``, BEGIN and COMMIT included; a worker adds
its fetch and its outcome, one round trip each).

What a stage spends, in order: its inquiry with the tenant and the stage before's token
(one statement), its input (none for intake, which reads the upload manifest off the
inquiry), the claim; in the closing transaction BEGIN, the stage before share-locked,
the results, success with the next stage's job (one statement), COMMIT. Feasibility
and calculate also read the tenant's catalog."""

from __future__ import annotations

import pytest

from pipeline.models import PipelineRun, Stage
from pipeline.stages import pipeline_stage_run
from tests.pipeline.conftest import submit
from tests.queueing.test_round_trips import round_trips

pytestmark = pytest.mark.django_db(transaction=True)

#: intake: read, claim, BEGIN, the file, its audit entry, success + next job, COMMIT.
#: extract: read, files, claim, BEGIN, lock, positions (DELETE, INSERT), warnings (DELETE;
#: none to INSERT here), the inquiry's old quote cleared, success + next job, COMMIT.
#: feasibility, calculate: read, positions, claim, catalog, BEGIN, lock, the results and
#: the inquiry (one statement), success (+ next job), COMMIT.
PINNED = {Stage.INTAKE: 7, Stage.EXTRACT: 11, Stage.FEASIBILITY: 9, Stage.CALCULATE: 9}


def test_each_stage_of_an_inquiry_spends_no_more_than_its_pinned_round_trips(tenant):
    anfrage = submit(tenant)
    spent = {}
    for stage in Stage:
        outcome, spent[stage] = round_trips(
            lambda stage=stage: pipeline_stage_run(anfrage_id=anfrage.id, stage=stage)
        )
        assert outcome == "completed", stage
    assert set(PipelineRun.objects.filter(anfrage=anfrage).values_list("status", flat=True)) == {
        "success"
    }
    over = {stage.value: n for stage, n in spent.items() if n > PINNED[stage]}
    assert not over, f"spent {spent}, pinned {PINNED}"
