"""The per-user serial queue under real concurrency: one first-pass job active per user,
FIFO starts, users in parallel, deltas beside the queue, promoters that cannot double-start.
"""

from __future__ import annotations

import pytest
from django.db import connection

from queueing.sweeps import run_sweep
from runs import admission, processing
from runs.models import AnalysisJob, JobStatus
from runs.selectors import credit_balance
from tests.conftest import jobs, run_concurrently
from tests.runs.factories import (
    DOC_HTML,
    SOURCES,
    backdate,
    drain,
    funded_user,
    register_worker,
)
from tests.runs.scenarios import Sampler

pytestmark = pytest.mark.django_db(transaction=True)


def admit(user, **kwargs):
    return admission.analysis_job_admit(
        user=user, title=kwargs.pop("title", "T"), doc_html=DOC_HTML, sources=SOURCES, **kwargs
    )


def test_fifty_concurrent_admits_run_one_at_a_time_in_fifo_order(clean_queue):
    user = funded_user(credits=50)

    with Sampler() as sampler:
        admissions = run_concurrently(lambda i: admit(user, title=f"T{i}"), 50)
        assert not [a for a in admissions if isinstance(a, BaseException)], admissions
        assert sorted(a.status for a in admissions) == ["pending"] + ["queued"] * 49
        assert sorted(a.queue_position for a in admissions) == list(range(50))
        ran = drain(worker_id=register_worker())

    assert sampler.samples > 10 and sampler.violations == []
    finished = list(AnalysisJob.objects.order_by("finished_at").values_list("pk", "status"))
    assert [pk for pk, _ in finished] == sorted(a.id for a in admissions)
    assert {status for _, status in finished} == {JobStatus.COMPLETE}
    assert len([r for r in ran if r.task_name == "runs.process_job"]) == 50
    assert credit_balance(user_id=user.pk) == 0


def test_two_users_admitted_together_run_in_parallel(clean_queue):
    users = [funded_user(credits=3), funded_user(credits=3)]

    admissions = run_concurrently(lambda i: admit(users[i % 2]), 6)

    active = AnalysisJob.objects.filter(status=JobStatus.PENDING)
    assert sorted(active.values_list("user_id", flat=True)) == sorted(u.pk for u in users)
    assert len(jobs(task_name="runs.process_job")) == 2
    worker = register_worker()
    run_concurrently(lambda i: drain(worker_id=worker), 2)
    assert set(AnalysisJob.objects.values_list("status", flat=True)) == {JobStatus.COMPLETE}
    assert len(admissions) == 6


def test_a_delta_admitted_while_five_wait_runs_at_once_and_blocks_nothing(clean_queue):
    user = funded_user(credits=10)
    parent = admit(user)
    processing.analysis_job_process(job_id=parent.id)
    first_pass = [admit(user) for _ in range(6)]
    assert [a.status for a in first_pass] == ["pending"] + ["queued"] * 5

    delta = admit(user, delta_of_job_id=parent.id)
    assert (delta.status, delta.queue_position) == ("pending", 0)
    assert processing.analysis_job_process(job_id=delta.id) == "complete"

    statuses = dict(AnalysisJob.objects.values_list("pk", "status"))
    assert statuses[delta.id] == JobStatus.COMPLETE
    assert [statuses[a.id] for a in first_pass] == ["pending"] + ["queued"] * 5
    drain(worker_id=register_worker())
    assert set(AnalysisJob.objects.values_list("status", flat=True)) == {JobStatus.COMPLETE}


def test_resume_tick_promotes_a_queue_whose_slot_was_freed_without_promotion(clean_queue):
    user = funded_user(credits=5)
    first, second, third = (admit(user) for _ in range(3))
    # The finishing transaction's promotion never happened (say, an operator fixed a row).
    AnalysisJob.objects.filter(pk=first.id).update(status=JobStatus.FAILED)

    result = run_sweep("analysis_resume")

    assert result.notes["promoted"] == 1
    statuses = dict(AnalysisJob.objects.values_list("pk", "status"))
    assert (statuses[second.id], statuses[third.id]) == ("pending", "queued")
    assert [j["args"]["job_id"] for j in jobs(task_name="runs.process_job")] == [
        first.id,
        second.id,
    ]
    assert run_sweep("analysis_resume").notes["promoted"] == 0


def test_concurrent_promoters_start_exactly_one_job(clean_queue):
    user = funded_user(credits=6)
    admitted = [admit(user) for _ in range(6)]
    AnalysisJob.objects.filter(pk=admitted[0].id).update(status=JobStatus.COMPLETE)

    promoted = run_concurrently(lambda i: admission.analysis_queue_promote(user_id=user.pk), 8)

    assert [p for p in promoted if p is not None] == [admitted[1].id]
    assert AnalysisJob.objects.filter(status=JobStatus.PENDING).count() == 1


def test_resume_tick_re_enqueues_an_active_job_whose_task_is_gone(clean_queue):
    user = funded_user(credits=2)
    job = admit(user)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    backdate("analysis_jobs", [job.id], seconds=3600)

    assert run_sweep("analysis_resume").notes["requeued"] == 1
    assert run_sweep("analysis_resume").notes["requeued"] == 0
    assert [j["args"]["job_id"] for j in jobs(task_name="runs.process_job")] == [job.id]
