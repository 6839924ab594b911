"""The pipeline on real worker subprocesses: throughput, deduplication, SIGKILL recovery,
and a stage whose job failed for good resumed by the pipeline_resume sweep.

Fault model — what can die, stall or race; what must hold; the test:

- twenty inquiries on two workers at once: every stage succeeds once
  (test_twenty_inquiries_run_through_all_four_stages)
- the same stage enqueued ten times at once: one job, run once
  (test_the_same_stage_enqueued_ten_times_at_once_runs_once)
- a worker SIGKILLed inside extract: the stalled sweep and a new worker recover it without
  duplicate positions (test_a_worker_killed_inside_extract_leaves_no_duplicates_and_recovers)
- a stage's job fails for good (an error no retry fixes): once the cause is fixed and the
  grace has passed, the resume sweep re-enqueues it and a worker completes the pipeline
  (test_a_stage_whose_job_failed_for_good_is_resumed_by_the_sweep)
"""

from __future__ import annotations

import os
import signal

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from pipeline.models import Anfrage, Catalog, PipelineRun, Position, Stage
from pipeline.stages import pipeline_stage_enqueue
from queueing.sweeps import run_sweep
from tests.conftest import jobs, recovery_ran, run_concurrently, wait_for
from tests.factories import TenantFactory
from tests.pipeline.conftest import submit

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def pipeline_jobs() -> list[dict]:
    """The stage jobs (workers also run the project's periodic sweeps)."""
    return [j for j in jobs() if j["task_name"].startswith("pipeline.")]


def successes() -> int:
    return PipelineRun.objects.filter(status="success").count()


def assert_one_success_per_stage(anfragen) -> None:
    per_key = (
        PipelineRun.objects.values("tenant", "anfrage", "stage")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not per_key.exists()
    for anfrage in anfragen:
        statuses = dict(PipelineRun.objects.filter(anfrage=anfrage).values_list("stage", "status"))
        assert statuses == {s.value: "success" for s in Stage}, (anfrage.id, statuses)


def test_twenty_inquiries_run_through_all_four_stages(clean_queue, pipeline_worker):
    tenants = [TenantFactory(slug="acme"), TenantFactory(slug="globex")]
    anfragen = [submit(tenants[i % 2], title=f"inquiry {i}") for i in range(20)]
    workers = [pipeline_worker(concurrency=2), pipeline_worker(concurrency=2)]
    wait_for(
        lambda: successes() == 80,
        timeout=60,
        message=f"80 successful stages; logs: {[w.log()[-2000:] for w in workers]}",
    )
    assert_one_success_per_stage(anfragen)
    assert set(PipelineRun.objects.values_list("attempts", flat=True)) == {1}
    assert not Anfrage.objects.filter(quote_total__isnull=True).exists()
    assert Position.objects.count() == 60
    wait_for(
        lambda: all(j["status"] == "succeeded" for j in pipeline_jobs()),
        timeout=10,
        message="every job succeeded",
    )
    assert len(pipeline_jobs()) == 80


def test_the_same_stage_enqueued_ten_times_at_once_runs_once(clean_queue, pipeline_worker):
    anfrage = submit(TenantFactory(slug="acme"))
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    results = run_concurrently(
        lambda i: pipeline_stage_enqueue(anfrage=anfrage, stage=Stage.INTAKE), 10
    )
    assert sum(r.created for r in results) == 1, results
    worker = pipeline_worker(concurrency=4)
    wait_for(lambda: successes() == 4, timeout=30, message=f"4 stages; {worker.log()[-2000:]}")
    assert_one_success_per_stage([anfrage])
    assert PipelineRun.objects.get(anfrage=anfrage, stage="intake").attempts == 1
    assert sorted(j["task_name"] for j in pipeline_jobs()) == sorted(
        f"pipeline.{s.value}" for s in Stage
    )


def test_a_worker_killed_inside_extract_leaves_no_duplicates_and_recovers(
    clean_queue, pipeline_worker, tmp_path
):
    gate = tmp_path / "gate"
    gate.mkdir()
    anfrage = submit(TenantFactory(slug="acme"))
    doomed = pipeline_worker(
        env={
            "DJANGO_SETTINGS_MODULE": "tests.pipeline.gated_settings",
            "PIPELINE_TEST_GATE": str(gate),
        }
    )
    wait_for(
        lambda: (gate / "entered").exists(),
        timeout=30,
        message=f"extract to start; {doomed.log()[-2000:]}",
    )
    os.killpg(doomed.process.pid, signal.SIGKILL)
    doomed.wait(timeout=10)

    [stalled] = jobs(task_name="pipeline.extract")
    assert stalled["status"] == "doing"
    assert PipelineRun.objects.get(anfrage=anfrage, stage="extract").status == "running"
    # Time travel: the dead worker's heartbeat and the stage's lease are long past.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour'"
        )
    recovery_ran(last_run_ago=0, resumed_ago=3600)  # and recovery watched all along
    result = run_sweep("stalled_jobs")
    assert result.notes == {"retried": 1}
    PipelineRun.objects.filter(anfrage=anfrage, stage="extract").update(
        lease_expires_at=timezone.now() - timezone.timedelta(seconds=1)
    )

    rescuer = pipeline_worker()
    wait_for(lambda: successes() == 4, timeout=30, message=f"recovery; {rescuer.log()[-2000:]}")
    assert_one_success_per_stage([anfrage])
    assert PipelineRun.objects.get(anfrage=anfrage, stage="extract").attempts == 2
    assert list(
        Position.objects.filter(anfrage=anfrage)
        .order_by("position_index")
        .values_list("position_index", flat=True)
    ) == [1, 2, 3]
    assert [j["status"] for j in jobs(task_name="pipeline.extract")] == ["succeeded"]


def test_a_stage_whose_job_failed_for_good_is_resumed_by_the_sweep(clean_queue, pipeline_worker):
    tenant = TenantFactory(slug="acme")
    broken = Catalog.objects.create(tenant=tenant, name="empty", materials={})
    anfrage = submit(tenant)
    worker = pipeline_worker()
    wait_for(
        lambda: [j["status"] for j in jobs(task_name="pipeline.feasibility")] == ["failed"],
        timeout=30,
        message=f"feasibility to fail for good; {worker.log()[-2000:]}",
    )
    run = PipelineRun.objects.get(anfrage=anfrage, stage="feasibility")
    assert run.status == "failed" and run.error.startswith("InvalidCatalog: ")

    broken.delete()  # the operator fixes the cause: the default catalog applies again
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pipeline_runs SET finished_at = finished_at - interval '1 hour'"
            " WHERE anfrage_id = %s",
            [anfrage.id],
        )
    # The worker runs the sweep on its own tick too; either run resumes it, once.
    run_sweep("pipeline_resume")
    wait_for(
        lambda: successes() == 4, timeout=30, message=f"the resumed run; {worker.log()[-2000:]}"
    )
    assert_one_success_per_stage([anfrage])
    run = PipelineRun.objects.get(anfrage=anfrage, stage="feasibility")
    assert (run.attempts, run.resumes) == (2, 1)
    assert Anfrage.objects.get(pk=anfrage.id).completed_at is not None
    assert run_sweep("pipeline_resume").selected == 0
