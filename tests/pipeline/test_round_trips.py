"""A stage's own work is lean on the wire: each stage of an inquiry, as ``pipeline_stage_run``
runs it, waits on exactly the round trips pinned here (counted between the Django
connection and the server by ``bench.wire``, BEGIN and COMMIT included; a worker adds
its fetch and its outcome, one round trip each), however many files, lines and positions
the inquiry has. A change that adds a statement, or one per row, fails here by name.

What a stage spends, in order: one statement that reads the inquiry, its tenant, the
stage before's token and the stage's input (the upload manifest, the files, or the
positions), the claim (for feasibility and calculate with the tenant's catalog after it,
in its round trip, so a run that claims after a replay prices with the catalog the replay
saw); then the
closing transaction in two: BEGIN, the stage before share-locked (not for intake, which
has none), the results, and success with the next stage's job and the job's own success
(one statement) travel together; then COMMIT."""

from __future__ import annotations

import pytest

from pipeline.models import Catalog, CatalogItem, PipelineRun, Position, Stage
from pipeline.stages import pipeline_stage_run
from tests.pipeline.conftest import ITEMS_CSV, ITEMS_TXT, submit
from tests.queueing.test_round_trips import round_trips

pytestmark = pytest.mark.django_db(transaction=True)

#: intake: read, claim, [BEGIN, the files with their audit entries, success + next job],
#: COMMIT.
#: extract: read (with the files), claim, [BEGIN, lock, the positions and warnings
#: replaced and the inquiry's old quote cleared (one statement), success + next job],
#: COMMIT.
#: feasibility, calculate: read (with the positions), [claim, the catalog], [BEGIN, lock,
#: the results and the inquiry (one statement), success (+ next job)], COMMIT.
#: (Brackets: one round trip.)
PINNED = {Stage.INTAKE: 4, Stage.EXTRACT: 4, Stage.FEASIBILITY: 4, Stage.CALCULATE: 4}


def spent_per_stage(anfrage) -> dict[Stage, int]:
    spent = {}
    for stage in Stage:
        outcome, spent[stage] = round_trips(
            lambda stage=stage: pipeline_stage_run(anfrage_id=anfrage.id, stage=stage)
        )
        assert outcome == "completed", stage
    assert set(PipelineRun.objects.filter(anfrage=anfrage).values_list("status", flat=True)) == {
        "success"
    }
    return spent


def test_each_stage_of_a_three_line_inquiry_spends_its_pinned_round_trips(tenant):
    assert spent_per_stage(submit(tenant)) == PINNED


def test_more_files_lines_and_a_catalog_of_its_own_cost_no_round_trip_more(tenant):
    catalog = Catalog.objects.create(
        tenant=tenant, name="own", currency="EUR", materials={"S235": ["steel"]}
    )
    CatalogItem.objects.create(
        catalog=catalog,
        code="beam",
        name="Beam",
        keywords=["beam"],
        materials=["S235"],
        unit="pcs",
        price_breaks=[["1", "10.00"]],
    )
    anfrage = submit(tenant, {"items.txt": ITEMS_TXT * 5, "list.csv": ITEMS_CSV})
    assert spent_per_stage(anfrage) == PINNED
    assert Position.objects.filter(anfrage=anfrage).count() == 17
