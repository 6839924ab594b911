"""A deactivated user: admission refuses them (an operator's retry or replay included), and
their waiting work never starts — queued jobs are cancelled by the resume tick, a pending
or unreleased running job by its own process_job — each refunded once, its held core run
(and the tenant's budget unit) given back. A job whose run the provider already started
finishes as usual."""

from __future__ import annotations

import pytest

from queueing.sweeps import run_sweep
from runs import admission, operations, processing
from runs.exceptions import UserInactive
from runs.models import AnalysisJob, CoreDailyUsage, CoreRunState, CreditEntry, JobStatus
from runs.selectors import credit_balance
from tests.runs.factories import DOC_HTML, SOURCES, funded_user


def admit(user):
    return admission.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)


def deactivate(user) -> None:
    user.is_active = False
    user.save(update_fields=["is_active"])


def budget_used() -> int:
    return sum(CoreDailyUsage.objects.values_list("used", flat=True))


@pytest.mark.django_db
def test_a_deactivated_user_is_refused_at_admission_and_nothing_is_written(table_counts):
    user = funded_user(credits=3)
    deactivate(user)
    before = table_counts()

    with pytest.raises(UserInactive):
        admit(user)

    assert table_counts() == before
    assert credit_balance(user_id=user.pk) == 3


@pytest.mark.django_db
def test_a_retry_of_a_deactivated_users_failed_job_charges_nothing(settings):
    user = funded_user(credits=3)
    job = admit(user)
    settings.RUNS_JUDGE = "tests.runs.test_release.RefusingJudge"
    assert processing.analysis_job_process(job_id=job.id) == "failed"
    deactivate(user)

    with pytest.raises(UserInactive):
        operations.analysis_job_retry(job_id=job.id, actor="admin:ops")

    assert AnalysisJob.objects.count() == 1
    assert credit_balance(user_id=user.pk) == 3


@pytest.mark.django_db
def test_a_deactivated_users_waiting_jobs_are_cancelled_refunded_and_given_back():
    user = funded_user(credits=5)
    pending, queued_1, queued_2 = admit(user), admit(user), admit(user)
    assert budget_used() == 3
    deactivate(user)

    assert run_sweep("analysis_resume").notes["deactivated_cancelled"] == 2
    assert processing.analysis_job_process(job_id=pending.id) == "cancelled"

    jobs = AnalysisJob.objects.select_related("core_run").filter(
        pk__in=[pending.id, queued_1.id, queued_2.id]
    )
    assert {j.status for j in jobs} == {JobStatus.CANCELLED}
    assert {j.core_run.state for j in jobs} == {CoreRunState.CANCELLED}
    assert credit_balance(user_id=user.pk) == 5
    assert CreditEntry.objects.filter(kind="refund").count() == 3
    assert budget_used() == 0
    assert processing.analysis_job_process(job_id=pending.id) == "skipped"
    assert run_sweep("analysis_resume").notes["deactivated_cancelled"] == 0


@pytest.mark.django_db
def test_process_job_of_a_deactivated_user_cancels_the_queue_behind_it():
    user = funded_user(credits=5)
    pending, queued = admit(user), admit(user)
    deactivate(user)

    assert processing.analysis_job_process(job_id=pending.id) == "cancelled"

    assert AnalysisJob.objects.get(pk=queued.id).status == JobStatus.CANCELLED
    assert credit_balance(user_id=user.pk) == 5


@pytest.mark.django_db
def test_other_users_queues_are_untouched():
    user, other = funded_user(credits=5), funded_user(credits=5)
    admit(user)
    admit(other)
    other_queued = admit(other)
    deactivate(user)

    run_sweep("analysis_resume")

    assert AnalysisJob.objects.get(pk=other_queued.id).status == JobStatus.QUEUED
    assert credit_balance(user_id=other.pk) == 3
