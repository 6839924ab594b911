"""Analyses with real worker processes: FIFO execution with promotion enqueued from inside
the running task, the credit invariant with two workers, and a SIGTERM in the middle of
the backstop sweep."""

from __future__ import annotations

import signal

import psycopg
import pytest
from django.db import connection

from queueing.sweeps import request_sweep
from runs import admission
from runs.models import AnalysisJob, AnalysisRun, JobStatus, RunJudgement
from tests.conftest import database_url, jobs, wait_for
from tests.runs.factories import (
    DOC_HTML,
    SOURCES,
    AnalysisJobFactory,
    active_first_pass_per_user,
    backdate,
    funded_user,
)
from tests.runs.scenarios import GRANT, Sampler, Scenario, assert_credit_invariant

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FLAKY_CORE = {"DJANGO_SETTINGS_MODULE": "tests.runs.worker_settings"}


def all_settled() -> bool:
    return not AnalysisJob.objects.filter(
        status__in=(JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING)
    ).exists()


def test_workers_run_one_users_jobs_one_at_a_time_in_fifo_order(clean_queue, start_worker):
    user = funded_user(credits=12)
    admitted = [
        admission.analysis_job_admit(user=user, title=f"T{i}", doc_html=DOC_HTML, sources=SOURCES)
        for i in range(12)
    ]
    with Sampler() as sampler:
        start_worker(concurrency=2)
        start_worker(concurrency=2)
        wait_for(all_settled, timeout=30, message="all jobs finished")

    assert sampler.violations == [] and active_first_pass_per_user() == {}
    finished = list(AnalysisJob.objects.order_by("finished_at").values_list("pk", "status"))
    assert finished == [(a.id, JobStatus.COMPLETE) for a in admitted]


def test_credit_invariant_with_two_real_workers_and_two_promoters(
    settings, clean_queue, start_worker
):
    settings.RUNS_CORE_CLIENT = "tests.runs.fakes.FlakyCore"
    users = [funded_user(credits=GRANT) for _ in range(3)]
    start_worker(env=FLAKY_CORE, concurrency=2)
    start_worker(env=FLAKY_CORE, concurrency=2)
    scenario = Scenario(users, workers=0)

    results = scenario.run()

    assert scenario.violations == []
    assert_credit_invariant(users, results[3:])


def test_sigterm_mid_sweep_finishes_the_row_it_holds_and_leaves_no_run_unjudged(
    clean_queue, start_worker, settings
):
    batch = [AnalysisJobFactory() for _ in range(5)]
    backdate("analysis_jobs", [j.pk for j in batch], seconds=settings.SWEEP_GRACE_SECONDS + 1)
    held = batch[2]
    # Another transaction holds the judge-job key of the third run: the sweep records that
    # run and then waits to enqueue its judge — the exact moment the seed's race is about.
    blocker = psycopg.connect(database_url())
    blocker.execute(
        "INSERT INTO procrastinate_jobs (queue_name, task_name, queueing_lock, args) "
        "VALUES ('analyses', 'runs.judge_run', %s, '{}')",
        [f"exclusive/run_judge:{held.run_id}:1"],
    )
    try:
        worker = start_worker()
        request_sweep("unsaved_runs")
        # Blocked by *this* blocker: a tick's singleton insert racing the request waits on
        # a lock for a moment too, and a SIGTERM then would stop the worker before the sweep.
        pid = blocker.info.backend_pid
        wait_for(lambda: _blocked_by(pid) > 0, timeout=20, message="the sweep to block")

        worker.signal(signal.SIGTERM)
        wait_for(lambda: "Stop requested" in worker.log(), timeout=10, message="drain start")
        assert worker.alive
    finally:
        blocker.rollback()
        blocker.close()
    assert worker.wait(timeout=20) == 0, worker.log()

    runs = AnalysisRun.objects.all()
    assert sorted(r.job_id for r in runs) == sorted(j.pk for j in batch)
    assert {r.saved_by for r in runs} == {"worker"}
    waiting = [j["args"] for j in jobs(task_name="runs.judge_run", status="todo")]
    assert sorted(a["run_id"] for a in waiting) == sorted(str(j.run_id) for j in batch)

    start_worker()
    wait_for(lambda: RunJudgement.objects.count() == 5, timeout=20, message="judgements")
    assert sorted(RunJudgement.objects.values_list("version", flat=True)) == [1] * 5


def _blocked_by(pid: int) -> int:
    """Sessions waiting for a lock that session ``pid`` holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", [pid]
        )
        return cursor.fetchone()[0]
