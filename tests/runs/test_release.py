"""Releasing the held core run: retries inside RELEASE_RETRY_WINDOW_SECONDS, then a
failure with exactly one refund; judge failures; cancellation; a job given up after its
release, which fails its judging core run at once
(``test_a_job_given_up_after_its_release_fails_its_judging_core_run``) or, when the core
was unreachable then, at the resume tick
(``test_the_resume_tick_fails_a_judging_core_run_whose_job_ended``). Time moves by
back-dating release_deadline, never by sleeping."""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from queueing.exceptions import RetryLater
from queueing.sweeps import run_sweep
from runs import admission, processing
from runs.core import LocalCore
from runs.exceptions import CoreUnavailable, JudgeError
from runs.models import AnalysisJob, CoreRun, CoreRunState, CreditEntry, CreditKind, JobStatus
from runs.selectors import credit_balance
from tests.conftest import run_concurrently
from tests.runs.factories import DOC_HTML, SOURCES, backdate, funded_user

WINDOW = datetime.timedelta(seconds=1800)


def admit(user):
    return admission.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)


def refunds(job_id: int) -> int:
    return CreditEntry.objects.filter(job_id=job_id, kind=CreditKind.REFUND).count()


def fail_first_release(job_id: int, settings) -> datetime.datetime:
    settings.CORE_AVAILABLE = False
    before = timezone.now()
    with pytest.raises(RetryLater) as raised:
        processing.analysis_job_process(job_id=job_id)
    assert before + WINDOW <= raised.value.deadline <= timezone.now() + WINDOW
    return raised.value.deadline


def outage_for(job_id: int, minutes: int) -> None:
    backdate(
        "analysis_jobs",
        [job_id],
        seconds=minutes * 60,
        columns=("release_deadline", "started_at", "updated_at"),
    )


@pytest.mark.django_db
def test_a_29_minute_outage_ends_complete_without_refund(settings):
    user = funded_user(credits=2)
    job = admit(user)
    deadline = fail_first_release(job.id, settings)

    outage_for(job.id, 29)
    with pytest.raises(RetryLater) as again:
        processing.analysis_job_process(job_id=job.id)
    assert again.value.deadline == deadline - datetime.timedelta(minutes=29)
    settings.CORE_AVAILABLE = True
    outcome = processing.analysis_job_process(job_id=job.id)

    row = AnalysisJob.objects.get(pk=job.id)
    assert (outcome, row.status, row.release_attempts) == ("complete", "complete", 3)
    assert CoreRun.objects.get(pk=row.core_run_id).state == CoreRunState.DONE
    assert refunds(job.id) == 0
    assert credit_balance(user_id=user.pk) == 1
    assert run_sweep("analysis_resume").notes["gave_up"] == 0


@pytest.mark.django_db
def test_a_31_minute_outage_fails_the_job_with_exactly_one_refund(settings):
    user = funded_user(credits=2)
    job = admit(user)
    waiting = admit(user)
    fail_first_release(job.id, settings)

    outage_for(job.id, 31)
    outcome = processing.analysis_job_process(job_id=job.id)

    row = AnalysisJob.objects.get(pk=job.id)
    assert (outcome, row.status) == ("gave_up", "failed")
    assert "unreachable" in row.error and "30-minute" in row.error
    assert CoreRun.objects.get(pk=row.core_run_id).state == CoreRunState.HELD
    assert refunds(job.id) == 1
    assert AnalysisJob.objects.get(pk=waiting.id).status == JobStatus.PENDING
    assert processing.analysis_job_process(job_id=job.id) == "skipped"
    assert run_sweep("analysis_resume").notes["gave_up"] == 0
    assert refunds(job.id) == 1
    assert credit_balance(user_id=user.pk) == 1


@pytest.mark.django_db
def test_resume_tick_gives_up_a_release_whose_retry_never_came_back(settings):
    user = funded_user(credits=1)
    job = admit(user)
    fail_first_release(job.id, settings)
    outage_for(job.id, 31)

    assert run_sweep("analysis_resume").notes["gave_up"] == 1

    assert AnalysisJob.objects.get(pk=job.id).status == JobStatus.FAILED
    assert processing.analysis_job_process(job_id=job.id) == "skipped"
    assert run_sweep("analysis_resume").notes["gave_up"] == 0
    assert refunds(job.id) == 1
    assert credit_balance(user_id=user.pk) == 1


@pytest.mark.django_db(transaction=True)
def test_the_task_and_the_tick_giving_up_at_once_refund_once(settings, clean_queue):
    user = funded_user(credits=1)
    job = admit(user)
    fail_first_release(job.id, settings)
    outage_for(job.id, 31)

    def give_up(i: int):
        if i % 2:
            return processing.analysis_job_process(job_id=job.id)
        return run_sweep("analysis_resume").notes["gave_up"]

    results = run_concurrently(give_up, 4)

    assert not [r for r in results if isinstance(r, BaseException)], results
    assert AnalysisJob.objects.get(pk=job.id).status == JobStatus.FAILED
    assert refunds(job.id) == 1
    assert credit_balance(user_id=user.pk) == 1


@pytest.mark.django_db
def test_a_judge_refusal_fails_the_job_refunds_it_and_hands_the_slot_on(settings):
    user = funded_user(credits=2)
    job, waiting = admit(user), admit(user)
    settings.RUNS_JUDGE = "tests.runs.test_release.RefusingJudge"

    assert processing.analysis_job_process(job_id=job.id) == "failed"

    row = AnalysisJob.objects.get(pk=job.id)
    assert row.status == JobStatus.FAILED and "cannot read" in row.error
    assert CoreRun.objects.get(pk=row.core_run_id).state == CoreRunState.FAILED
    assert refunds(job.id) == 1
    assert AnalysisJob.objects.get(pk=waiting.id).status == JobStatus.PENDING


@pytest.mark.django_db
def test_a_crashing_judge_leaves_the_job_running_for_the_retry(settings):
    user = funded_user(credits=1)
    job = admit(user)
    settings.RUNS_JUDGE = "tests.runs.test_release.CrashingJudge"

    with pytest.raises(TimeoutError):
        processing.analysis_job_process(job_id=job.id)
    assert AnalysisJob.objects.get(pk=job.id).status == JobStatus.RUNNING

    settings.RUNS_JUDGE = "runs.judge.OverlapJudge"
    assert processing.analysis_job_process(job_id=job.id) == "complete"
    row = AnalysisJob.objects.get(pk=job.id)
    assert (row.release_attempts, refunds(job.id)) == (1, 0)


@pytest.mark.django_db
def test_core_unreachable_when_closing_retries_without_committing(settings, monkeypatch):
    user = funded_user(credits=1)
    job = admit(user)
    from runs.core import LocalCore
    from runs.exceptions import CoreUnavailable

    def down(self, **kwargs):
        raise CoreUnavailable()

    with monkeypatch.context() as patch:
        patch.setattr(LocalCore, "finish", down)
        with pytest.raises(RetryLater):
            processing.analysis_job_process(job_id=job.id)
    row = AnalysisJob.objects.get(pk=job.id)
    assert (row.status, row.results) == (JobStatus.RUNNING, None)
    assert not row.citations.exists()

    assert processing.analysis_job_process(job_id=job.id) == "complete"


@pytest.mark.django_db
def test_cancelling_a_queued_job_refunds_it_once():
    user = funded_user(credits=2)
    running, queued = admit(user), admit(user)

    assert admission.analysis_job_cancel(job_id=queued.id) is True
    assert admission.analysis_job_cancel(job_id=queued.id) is False
    assert admission.analysis_job_cancel(job_id=running.id) is False

    assert AnalysisJob.objects.get(pk=queued.id).status == JobStatus.CANCELLED
    assert refunds(queued.id) == 1
    assert credit_balance(user_id=user.pk) == 1


class RefusingJudge:
    name = "refusing"

    def judge(self, *, claim, source):
        raise JudgeError("cannot read this citation style")


class CrashingJudge:
    name = "crashing"

    def judge(self, *, claim, source):
        raise TimeoutError("remote judge timed out")


@pytest.mark.django_db
def test_a_core_run_closed_behind_the_jobs_back_fails_it_with_a_refund():
    user = funded_user(credits=1)
    job = admit(user)
    row = AnalysisJob.objects.get(pk=job.id)
    CoreRun.objects.filter(pk=row.core_run_id).update(state=CoreRunState.FAILED)

    assert processing.analysis_job_process(job_id=job.id) == "failed"

    row.refresh_from_db()
    assert row.status == JobStatus.FAILED and "refused to release" in row.error
    assert refunds(job.id) == 1


def judging_job(settings) -> tuple[int, int]:
    """A job whose core run was released and whose judge crashed: it stays running, its
    core run judging, until a retry (or the give-up hook) ends it. (job id, core run id)"""
    job = admit(funded_user(credits=1))
    settings.RUNS_JUDGE = "tests.runs.test_release.CrashingJudge"
    with pytest.raises(TimeoutError):
        processing.analysis_job_process(job_id=job.id)
    core_run_id = AnalysisJob.objects.get(pk=job.id).core_run_id
    assert CoreRun.objects.get(pk=core_run_id).state == CoreRunState.JUDGING
    return job.id, core_run_id


@pytest.mark.django_db
def test_a_job_given_up_after_its_release_fails_its_judging_core_run(settings):
    job_id, core_run_id = judging_job(settings)

    assert processing.analysis_job_abandon(job_id=job_id, reason="its last attempt failed")

    core_run = CoreRun.objects.get(pk=core_run_id)
    assert (core_run.state, refunds(job_id)) == (CoreRunState.FAILED, 1)
    assert "its last attempt failed" in core_run.error


@pytest.mark.django_db
def test_the_resume_tick_fails_a_judging_core_run_whose_job_ended(settings, monkeypatch):
    job_id, core_run_id = judging_job(settings)

    def down(self, **kwargs):
        raise CoreUnavailable()

    with monkeypatch.context() as patch:
        patch.setattr(LocalCore, "finish", down)
        assert processing.analysis_job_abandon(job_id=job_id, reason="gave up")
    assert CoreRun.objects.get(pk=core_run_id).state == CoreRunState.JUDGING

    assert admission.held_runs_expire() == 1

    assert CoreRun.objects.get(pk=core_run_id).state == CoreRunState.FAILED
    assert admission.held_runs_expire() == 0
