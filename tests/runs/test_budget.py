"""The tenant's daily provider budget is given back exactly when the provider did no work.

A unit is taken when the held core run is created (at admission) and given back when that
run is cancelled while still held: the admission was refused, the queued job was
cancelled, the job's release failed for good, its user was deactivated. A run that was
released keeps its unit (the provider worked), whatever becomes of the job.

Fault model: the core can be unreachable when the job ends (then the run stays held and
the resume tick's expiry gives it back:
``test_a_release_that_failed_for_good_is_given_back_once_the_core_is_back``); the cancel
and the expiry can race an admission committing its run (``test_admission_races.py``).
"""

from __future__ import annotations

import datetime

import pytest
from django.utils import timezone

from queueing.exceptions import RetryLater
from queueing.sweeps import run_sweep
from runs import admission, processing
from runs.exceptions import BudgetExhausted
from runs.models import AnalysisJob, CoreDailyUsage, CoreRun, CoreRunState
from runs.selectors import credit_balance
from tests.runs.factories import DOC_HTML, SOURCES, backdate, funded_user


def admit(user):
    return admission.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)


def budget_used() -> int:
    return sum(CoreDailyUsage.objects.values_list("used", flat=True))


def core_state(job_id: int) -> str:
    return AnalysisJob.objects.select_related("core_run").get(pk=job_id).core_run.state


def fail_release_for_good(job_id: int, settings) -> None:
    settings.CORE_AVAILABLE = False
    with pytest.raises(RetryLater):
        processing.analysis_job_process(job_id=job_id)
    backdate("analysis_jobs", [job_id], seconds=31 * 60, columns=("release_deadline",))


@pytest.mark.django_db
def test_cancelling_a_queued_job_gives_its_budget_unit_back(settings):
    settings.CORE_DAILY_BUDGET = 2
    user = funded_user(credits=5)
    admit(user)
    queued = admit(user)
    assert budget_used() == 2

    assert admission.analysis_job_cancel(job_id=queued.id)

    assert budget_used() == 1
    assert core_state(queued.id) == CoreRunState.CANCELLED
    admit(user)  # the unit is there again today, not at UTC midnight
    with pytest.raises(BudgetExhausted):
        admit(user)
    assert credit_balance(user_id=user.pk) == 3


@pytest.mark.django_db
def test_the_resume_tick_giving_a_release_up_gives_its_budget_unit_back(settings):
    user = funded_user(credits=5)
    job = admit(user)
    fail_release_for_good(job.id, settings)
    settings.CORE_AVAILABLE = True

    assert run_sweep("analysis_resume").notes["gave_up"] == 1

    assert core_state(job.id) == CoreRunState.CANCELLED
    assert budget_used() == 0


@pytest.mark.django_db
def test_a_release_that_failed_for_good_is_given_back_once_the_core_is_back(settings):
    user = funded_user(credits=5)
    job = admit(user)
    fail_release_for_good(job.id, settings)  # the core stays down

    assert processing.analysis_job_process(job_id=job.id) == "gave_up"
    assert core_state(job.id) == CoreRunState.HELD  # the core could not hear of it
    assert run_sweep("analysis_resume").notes["held_expired"] == 0  # still down
    settings.CORE_AVAILABLE = True
    assert budget_used() == 1

    assert run_sweep("analysis_resume").notes["held_expired"] == 1

    assert core_state(job.id) == CoreRunState.CANCELLED
    assert budget_used() == 0
    assert run_sweep("analysis_resume").notes["held_expired"] == 0  # once


@pytest.mark.django_db
def test_an_abandoned_job_that_never_released_gives_its_unit_back(settings):
    user = funded_user(credits=5)
    job = admit(user)

    assert processing.analysis_job_abandon(job_id=job.id, reason="cancelled by admin:ops")

    assert core_state(job.id) == CoreRunState.CANCELLED
    assert budget_used() == 0


@pytest.mark.django_db
def test_a_released_run_keeps_its_unit_whatever_becomes_of_the_job(settings):
    user = funded_user(credits=5)
    complete = admit(user)
    assert processing.analysis_job_process(job_id=complete.id) == "complete"
    settings.RUNS_JUDGE = "tests.runs.test_release.RefusingJudge"
    failed = admit(user)
    assert processing.analysis_job_process(job_id=failed.id) == "failed"

    assert core_state(complete.id) == CoreRunState.DONE
    assert core_state(failed.id) == CoreRunState.FAILED
    assert budget_used() == 2
    assert run_sweep("analysis_resume").notes["held_expired"] == 0
    assert budget_used() == 2


@pytest.mark.django_db
def test_the_expiry_never_takes_the_run_of_a_job_that_may_still_release_it(settings):
    user = funded_user(credits=5)
    pending, queued = admit(user), admit(user)
    old = timezone.now() - datetime.timedelta(days=2)
    CoreRun.objects.update(created_at=old)

    assert run_sweep("analysis_resume").notes["held_expired"] == 0

    assert {core_state(pending.id), core_state(queued.id)} == {CoreRunState.HELD}
    assert budget_used() == 2
