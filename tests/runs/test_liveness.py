"""Liveness of the analysis queue: no analysis stays active behind a job that is over, no
user's queue waits for ever, no late admit jumps it.

Fault model — at each step, what can die, stall or race, and the test of each cell:

process_job runs, and
- its last attempt fails (a crashing judge): the give-up hook fails the analysis, refunds
  it once and starts the next — test_a_job_that_fails_for_good_frees_its_users_queue
  (real worker) and test_the_give_up_hook_settles_once_whoever_calls_it
- its workers keep dying (the stall budget is spent): the same hook —
  test_stalled_recovery_giving_up_settles_the_analysis
- an operator cancels its waiting job: the same hook — test_an_operator_cancel_settles_the_analysis
- its job vanishes (deleted by hand): the resume tick re-enqueues it, at most
  ANALYSIS_MAX_REQUEUES times, then fails it —
  test_a_lost_task_is_requeued_a_bounded_number_of_times
- it is merely slow or retrying: nothing steps in — test_a_live_task_is_never_duplicated_or_failed
the slot frees without a promotion (a crash, an operator), and
- a new admit arrives: it queues behind the older jobs and the oldest starts —
  test_a_late_admit_waits_behind_older_queued_jobs
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueing import giveup
from queueing.jobs import job_cancel
from queueing.sweeps import run_sweep
from runs import admission, processing
from runs.models import AnalysisJob, CreditEntry, CreditKind, JobStatus
from tests.conftest import jobs, make_doing, wait_for
from tests.runs.factories import DOC_HTML, SOURCES, backdate, funded_user
from tests.runs.fakes import BROKEN_KEY

pytestmark = pytest.mark.django_db(transaction=True)


def admit(user, *, sources=SOURCES, title="T", doc_html=DOC_HTML):
    return admission.analysis_job_admit(user=user, title=title, doc_html=doc_html, sources=sources)


def status(job_id: int) -> str:
    return AnalysisJob.objects.values_list("status", flat=True).get(pk=job_id)


def refunds(job_id: int) -> int:
    return CreditEntry.objects.filter(job_id=job_id, kind=CreditKind.REFUND).count()


def process_jobs(job_id: int) -> list[dict]:
    return [j for j in jobs(task_name="runs.process_job") if j["args"]["job_id"] == job_id]


def make_running(job_id: int) -> None:
    AnalysisJob.objects.filter(pk=job_id).update(status=JobStatus.RUNNING)


@pytest.mark.slow
def test_a_job_that_fails_for_good_frees_its_users_queue(clean_queue, start_worker):
    user = funded_user(credits=5)
    broken = admit(
        user,
        sources=[*SOURCES, {"key": BROKEN_KEY, "title": "x", "text": "y"}],
        doc_html=DOC_HTML + f"<p>A claim the judge chokes on [{BROKEN_KEY}].</p>",
    )
    after = admit(user, title="after")
    assert (broken.status, after.status) == ("pending", "queued")

    worker = start_worker(env={"DJANGO_SETTINGS_MODULE": "tests.runs.broken_judge_settings"})
    wait_for(
        lambda: status(after.id) == JobStatus.COMPLETE,
        timeout=60,
        message=f"the next job to run\n{worker.log()[-2000:]}",
    )
    job = AnalysisJob.objects.get(pk=broken.id)
    assert job.status == JobStatus.FAILED and "could not be completed" in job.error
    assert refunds(broken.id) == 1
    assert [j["status"] for j in process_jobs(broken.id)] == ["failed"]


def test_the_give_up_hook_settles_once_whoever_calls_it(clean_queue):
    user = funded_user(credits=5)
    first, second = admit(user), admit(user, title="second")
    make_running(first.id)

    assert processing.analysis_job_abandon(job_id=first.id, reason="its job 1 failed") is True
    assert processing.analysis_job_abandon(job_id=first.id, reason="again") is False
    assert status(first.id) == JobStatus.FAILED and refunds(first.id) == 1
    assert status(second.id) == JobStatus.PENDING
    assert [j["status"] for j in process_jobs(second.id)] == ["todo"]


def test_stalled_recovery_giving_up_settles_the_analysis(clean_queue, settings):
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 0
    user = funded_user(credits=5)
    first, second = admit(user), admit(user, title="second")
    make_running(first.id)
    [job] = process_jobs(first.id)
    make_doing(job["id"], heartbeat_age_s=3600)

    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    # Recovery records the give-up; a process that has the hook runs it.
    assert status(first.id) == JobStatus.RUNNING
    assert giveup.settle_owed(job_id=job["id"]) == 1
    assert status(first.id) == JobStatus.FAILED and refunds(first.id) == 1
    assert status(second.id) == JobStatus.PENDING


def test_an_operator_cancel_settles_the_analysis(clean_queue):
    user = funded_user(credits=5)
    first, second = admit(user), admit(user, title="second")
    [job] = process_jobs(first.id)

    assert job_cancel(job_id=job["id"], actor="admin:ops") is True
    assert status(first.id) == JobStatus.FAILED and refunds(first.id) == 1
    assert "cancelled by admin:ops" in AnalysisJob.objects.get(pk=first.id).error
    assert status(second.id) == JobStatus.PENDING
    assert job_cancel(job_id=job["id"], actor="admin:ops") is False


def test_a_lost_task_is_requeued_a_bounded_number_of_times(clean_queue, settings):
    settings.ANALYSIS_MAX_REQUEUES = 2
    user = funded_user(credits=5)
    first, second = admit(user), admit(user, title="second")
    make_running(first.id)

    def lose_the_task() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM procrastinate_jobs WHERE task_name = 'runs.process_job' "
                "AND args->>'job_id' = %s",
                [str(first.id)],
            )
        backdate("analysis_jobs", [first.id], seconds=3600)

    for expected in ({"requeued": 1}, {"requeued": 1}, {"abandoned": 1}):
        lose_the_task()
        notes = run_sweep("analysis_resume").notes
        assert {k: v for k, v in notes.items() if v and k in ("requeued", "abandoned")} == expected
    assert status(first.id) == JobStatus.FAILED and refunds(first.id) == 1
    assert "lost 3 times" in AnalysisJob.objects.get(pk=first.id).error
    assert status(second.id) == JobStatus.PENDING


def test_a_live_task_is_never_duplicated_or_failed(clean_queue, settings):
    settings.ANALYSIS_MAX_REQUEUES = 0
    user = funded_user(credits=5)
    first = admit(user)
    make_running(first.id)
    backdate("analysis_jobs", [first.id], seconds=3600)  # slow, but its task still waits

    for _ in range(3):
        notes = run_sweep("analysis_resume").notes
        assert notes["requeued"] == 0 and notes["abandoned"] == 0
    assert status(first.id) == JobStatus.RUNNING
    assert len(process_jobs(first.id)) == 1


def test_a_late_admit_waits_behind_older_queued_jobs(clean_queue):
    user = funded_user(credits=5)
    first, second = admit(user), admit(user, title="second")
    # The slot frees without a promotion (an operator marked the job done by hand).
    AnalysisJob.objects.filter(pk=first.id).update(status=JobStatus.COMPLETE)

    late = admit(user, title="late")

    assert late.status == JobStatus.QUEUED and late.queue_position == 1
    assert status(second.id) == JobStatus.PENDING
    assert [j["status"] for j in process_jobs(second.id)] == ["todo"]


def test_the_resume_tick_costs_a_few_statements_however_many_slow_jobs_it_checks(clean_queue):
    """Slow jobs whose tasks still run are checked with one look-up, not one enqueue each."""
    users = [funded_user(credits=1) for _ in range(20)]
    admitted = [admit(user) for user in users]
    for job in admitted:
        make_running(job.id)
    backdate("analysis_jobs", [a.id for a in admitted], seconds=3600)

    with CaptureQueriesContext(connection) as captured:
        notes = run_sweep("analysis_resume").notes
    assert notes["requeued"] == 0 and notes["abandoned"] == 0
    assert len(captured) <= 10, [q["sql"][:80] for q in captured]


def test_a_lost_task_is_found_behind_any_number_of_slow_ones(clean_queue):
    """The resume tick reads only jobs whose task is gone: a full batch of older jobs
    that are merely slow (their tasks wait or run) never hides a lost one."""
    slow = [admit(funded_user(credits=1)).id for _ in range(3)]
    lost = admit(funded_user(credits=1)).id
    AnalysisJob.objects.filter(pk__in=[*slow, lost]).update(status=JobStatus.RUNNING)
    backdate("analysis_jobs", slow, seconds=7200)
    backdate("analysis_jobs", [lost], seconds=3600)
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM procrastinate_jobs WHERE task_name = 'runs.process_job' "
            "AND args->>'job_id' = %s",
            [str(lost)],
        )
    outcome = processing.analysis_jobs_requeue_lost(idle_seconds=60, limit=3)
    assert (outcome.requeued, outcome.abandoned) == (1, 0)
    assert [j["status"] for j in process_jobs(lost)] == ["todo"]
