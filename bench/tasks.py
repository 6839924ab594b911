"""The tasks the benchmark's workers run (loaded by workers via PGSTAGE_TASK_MODULES).

Baselines are plain procrastinate tasks (``procrastinate_app.task``) whose body does
nothing but what the scenario needs of both sides:

* ``bench.noop`` — nothing at all (the sink the next hops land in, and the defer baseline);
* ``bench.noop_next`` — defers its next hop with procrastinate's own ``defer``;
* ``bench.hop`` — one hop of a plain chain: defers the next hop until the last.

``bench.noop_task`` is a ``queueing.app.task`` that does nothing: pgstage's worker and
task wrapper on a job with no work, set against ``bench.noop`` on procrastinate's worker.

``bench.stage`` is pgstage's stage path with no work in it, as ``pipeline_stage_run`` runs
a stage: the task wrapper of ``queueing.app.task`` (``claims_first``, as the pipeline's
stage tasks), the ledger claim committed on its own, then ``complete`` and the next hop's
enqueue with an EXCLUSIVE key in one statement.
"""

from __future__ import annotations

from django.db import models
from procrastinate.contrib.django import app as procrastinate_app

from queueing.app import task
from queueing.enqueue import Policy, job_params
from queueing.keys import KeyFormat
from queueing.ledger import Ledger, LedgerEntry

#: The singleton key of a bench stage job and of the next hop it enqueues.
STAGE_KEY = KeyFormat(prefix="bench", parts=("hop", "unit"))
#: The queue the next hops land in; no bench worker takes jobs from it.
SINK_QUEUE = "bench_sink"
NOOP = "bench.noop"
NOOP_NEXT = "bench.noop_next"
HOP = "bench.hop"
STAGE = "bench.stage"
NOOP_TASK = "bench.noop_task"
#: Hops of a plain chain: as many as an inquiry has stages.
CHAIN_HOPS = 4


class BenchStep(LedgerEntry):
    unit = models.CharField(max_length=64)
    stage = models.CharField(max_length=20)

    class Meta:
        app_label = "queueing"
        db_table = "bench_steps"
        constraints = [models.UniqueConstraint(fields=["unit", "stage"], name="bench_steps_uq")]

    def __str__(self) -> str:
        return f"{self.unit}/{self.stage}"


LEDGER = Ledger(model=BenchStep, key_fields=("unit", "stage"))


@procrastinate_app.task(name=NOOP)
def noop(**_: object) -> None:
    """The true no-op."""


@procrastinate_app.task(name=NOOP_NEXT)
def noop_next(unit: str) -> None:
    """Does nothing but defer its next hop (the stage job's baseline)."""
    noop.configure(queue=SINK_QUEUE).defer(unit=unit)


@procrastinate_app.task(name=HOP, pass_context=True)
def chain_hop(context, chain: str, hop: int) -> None:
    """One hop of a plain chain; the next hop goes to the same queue."""
    if hop < CHAIN_HOPS:
        procrastinate_app.configure_task(HOP, queue=context.job.queue).defer(
            chain=chain, hop=hop + 1
        )


@task(name=NOOP_TASK)
def noop_task(**_: object) -> None:
    """pgstage's task wrapper with nothing in it: what pgstage's worker spends on a job
    before any work (the stage job is this plus its claim and its completion)."""


@task(name=STAGE, claims_first=True)
def stage(unit: str) -> str:
    """Claim, no work, then complete, enqueue the next hop and save the job's success in
    one statement (``Ledger.complete(then=..., finish_job=True)``, as
    ``pipeline_stage_run`` closes a stage)."""
    claim = LEDGER.claim(unit=unit, stage="s")
    if not claim.claimed:
        return claim.outcome.value
    LEDGER.complete(
        claim,
        then=job_params(
            NOOP,
            args={"unit": unit},
            queue=SINK_QUEUE,
            key=STAGE_KEY.build(hop="next", unit=unit),
            policy=Policy.EXCLUSIVE,
        ),
        finish_job=True,
    )
    return "completed"
