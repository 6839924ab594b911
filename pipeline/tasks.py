"""The four stage tasks. Thin: each takes an inquiry id and runs its stage's service.

A job of each carries the singleton key ``stage:tenant:anfrage`` under the EXCLUSIVE
policy (``stages.pipeline_stage_enqueue``); the stage ledger makes a duplicate run a
no-op even if a job escaped that (e.g. one recovered after its worker died). Each claims
its stage before anything else (``claims_first``): its fetch needs no flush of its own
(``queueing.flush``).
"""

from __future__ import annotations

from pipeline import sweeps  # noqa: F401  (declares the resume and staging cleanup sweeps)
from pipeline.models import Stage
from pipeline.stages import TASK_NAMES, pipeline_stage_run
from queueing.app import task


@task(name=TASK_NAMES[Stage.INTAKE], claims_first=True)
def intake(anfrage_id: int) -> str:
    return pipeline_stage_run(anfrage_id=anfrage_id, stage=Stage.INTAKE)


@task(name=TASK_NAMES[Stage.EXTRACT], claims_first=True)
def extract(anfrage_id: int) -> str:
    return pipeline_stage_run(anfrage_id=anfrage_id, stage=Stage.EXTRACT)


@task(name=TASK_NAMES[Stage.FEASIBILITY], claims_first=True)
def feasibility(anfrage_id: int) -> str:
    return pipeline_stage_run(anfrage_id=anfrage_id, stage=Stage.FEASIBILITY)


@task(name=TASK_NAMES[Stage.CALCULATE], claims_first=True)
def calculate(anfrage_id: int) -> str:
    return pipeline_stage_run(anfrage_id=anfrage_id, stage=Stage.CALCULATE)
