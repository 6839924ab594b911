"""Operators' retry of failed analyses (runs.operations.analysis_job_retry) and the
"no run yet" selectors behind the admin filter, the Sweeps page and the metric.

Fault model of a retry: two operators retry the same job at once → one new job
(``test_concurrent_retries_make_one_job``); the retry is refused by admission (no credit)
→ nothing written (``test_a_refused_retry_writes_nothing``); the job is not failed or its
body was trimmed → refused (``test_only_failed_jobs_with_their_body_are_retried``); the
new job fails again → it can be retried in turn, the first one cannot
(``test_a_retry_of_a_retry``).
"""

from __future__ import annotations

import datetime

import pytest
from django.db import transaction
from django.utils import timezone

from runs import admission, durability, operations, processing
from runs.exceptions import InsufficientCredits, JobNotFound, RetryRefused
from runs.models import AnalysisAudit, AnalysisJob, AnalysisRun, CreditEntry, JobStatus, SavedBy
from runs.selectors import (
    credit_balance,
    retryable_failed_jobs,
    unsaved_counts_by_age,
    unsaved_jobs,
)
from tests.conftest import run_concurrently
from tests.runs.factories import DOC_HTML, SOURCES, AnalysisJobFactory, backdate, funded_user

pytestmark = pytest.mark.django_db


def failed_job(user, *, reason: str = "the judge could not judge this document") -> AnalysisJob:
    """Admit a job and fail it the way processing does (refunded, slot handed on)."""
    admitted = admission.analysis_job_admit(
        user=user, title="Chapter", doc_html=DOC_HTML, sources=SOURCES
    )
    with transaction.atomic():
        processing.job_fail(admission.lock_job(admitted.id), reason=reason)
    return AnalysisJob.objects.get(pk=admitted.id)


def test_a_failed_job_is_admitted_again_in_its_run_and_audited():
    user = funded_user(credits=3)
    job = failed_job(user)
    assert credit_balance(user_id=user.pk) == 3  # charged, then refunded

    retried = operations.analysis_job_retry(job_id=job.pk, actor="command:test")

    assert retried.outcome is operations.RetryOutcome.RETRIED
    new = AnalysisJob.objects.get(pk=retried.new_job_id)
    assert (new.run_id, new.user_id, new.title, new.sources) == (
        job.run_id,
        user.pk,
        job.title,
        job.sources,
    )
    assert new.status == JobStatus.PENDING == retried.status
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED  # history stays
    assert credit_balance(user_id=user.pk) == 2  # the new job is charged once
    entry = AnalysisAudit.objects.get(job=job)
    assert (entry.action, entry.actor, entry.tenant_id) == ("retry", "command:test", job.tenant_id)
    assert entry.payload["new_job_id"] == new.pk
    assert entry.payload["error"] == "the judge could not judge this document"


def test_a_second_retry_names_the_first_and_writes_nothing():
    job = failed_job(funded_user(credits=3))
    first = operations.analysis_job_retry(job_id=job.pk, actor="a")
    again = operations.analysis_job_retry(job_id=job.pk, actor="b")
    assert again.outcome is operations.RetryOutcome.ALREADY_RETRIED
    assert again.new_job_id == first.new_job_id
    assert AnalysisJob.objects.filter(run_id=job.run_id).count() == 2
    assert AnalysisAudit.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_make_one_job():
    job = failed_job(funded_user(credits=5))
    results = run_concurrently(
        lambda i: operations.analysis_job_retry(job_id=job.pk, actor=f"op{i}"), 8
    )
    assert not [r for r in results if isinstance(r, BaseException)], results
    outcomes = sorted(r.outcome for r in results)
    assert outcomes.count(operations.RetryOutcome.RETRIED) == 1
    assert {r.new_job_id for r in results} == {
        next(r.new_job_id for r in results if r.outcome is operations.RetryOutcome.RETRIED)
    }
    assert AnalysisJob.objects.filter(run_id=job.run_id).count() == 2


def test_a_queued_retry_waits_behind_the_users_active_job():
    user = funded_user(credits=5)
    job = failed_job(user)
    admission.analysis_job_admit(user=user, title="busy", doc_html=DOC_HTML, sources=SOURCES)
    retried = operations.analysis_job_retry(job_id=job.pk, actor="x")
    assert (retried.status, retried.queue_position) == ("queued", 1)


def test_only_failed_jobs_with_their_body_are_retried():
    user = funded_user(credits=5)
    done = AnalysisJobFactory(user=user)
    with pytest.raises(RetryRefused, match="is complete"):
        operations.analysis_job_retry(job_id=done.pk, actor="x")
    trimmed = failed_job(user)
    AnalysisJob.objects.filter(pk=trimmed.pk).update(doc_html=None)
    with pytest.raises(RetryRefused, match="trimmed"):
        operations.analysis_job_retry(job_id=trimmed.pk, actor="x")
    with pytest.raises(JobNotFound):
        operations.analysis_job_retry(job_id=10**12, actor="x")
    assert AnalysisAudit.objects.count() == 0


def test_a_refused_retry_writes_nothing():
    user = funded_user(credits=1)
    job = failed_job(user)
    admission.analysis_job_admit(user=user, title="spent", doc_html=DOC_HTML, sources=SOURCES)
    jobs, entries = AnalysisJob.objects.count(), CreditEntry.objects.count()
    with pytest.raises(InsufficientCredits):
        operations.analysis_job_retry(job_id=job.pk, actor="x")
    assert (AnalysisJob.objects.count(), CreditEntry.objects.count()) == (jobs, entries)
    assert AnalysisAudit.objects.count() == 0


def test_dry_run_checks_and_writes_nothing():
    job = failed_job(funded_user(credits=2))
    dry = operations.analysis_job_retry(job_id=job.pk, actor="x", dry_run=True)
    assert dry.outcome is operations.RetryOutcome.WOULD_RETRY
    assert AnalysisJob.objects.filter(run_id=job.run_id).count() == 1
    assert AnalysisAudit.objects.count() == 0


def test_a_retry_of_a_retry():
    user = funded_user(credits=5)
    job = failed_job(user)
    second = operations.analysis_job_retry(job_id=job.pk, actor="x").new_job_id
    with transaction.atomic():
        processing.job_fail(admission.lock_job(second), reason="again")
    assert retryable_failed_jobs() == [second]
    third = operations.analysis_job_retry(job_id=second, actor="x")
    assert third.outcome is operations.RetryOutcome.RETRIED
    assert retryable_failed_jobs() == []


def test_retryable_failed_jobs_by_user_and_age():
    ann, bob = funded_user(credits=3, username="ann"), funded_user(credits=3, username="bob")
    old, new, bobs = failed_job(ann), failed_job(ann), failed_job(bob)
    backdate("analysis_jobs", [old.pk], seconds=3 * 86400, columns=("finished_at",))
    assert retryable_failed_jobs() == [old.pk, new.pk, bobs.pk]
    assert retryable_failed_jobs(user_id=ann.pk) == [old.pk, new.pk]
    since = timezone.now() - datetime.timedelta(days=1)
    assert retryable_failed_jobs(user_id=ann.pk, since=since) == [new.pk]


def test_unsaved_jobs_are_finished_jobs_no_run_holds(settings):
    settings.SWEEP_GRACE_SECONDS = 120
    user = funded_user(credits=0)
    fresh, stale, ancient = (AnalysisJobFactory(user=user) for _ in range(3))
    # A job counts as saved when its run holds it or a newer job of the run.
    older = AnalysisJobFactory(user=user)
    saved = AnalysisJobFactory(user=user, run_id=older.run_id)
    AnalysisRun.objects.create(
        id=saved.run_id, tenant_id=user.tenant_id, user=user, job=saved, saved_by=SavedBy.CLIENT
    )
    AnalysisJobFactory(user=user, status=JobStatus.RUNNING, results=None)
    backdate("analysis_jobs", [stale.pk], seconds=600, columns=("finished_at",))
    backdate("analysis_jobs", [ancient.pk], seconds=2 * 86400, columns=("finished_at",))

    assert sorted(unsaved_jobs().values_list("pk", flat=True)) == [fresh.pk, stale.pk, ancient.pk]
    assert unsaved_counts_by_age() == {
        "under_grace": 1,
        "under_1h": 1,
        "under_24h": 0,
        "over_24h": 1,
    }


def versioned(user, version: str, *, parent: int | None = None) -> int:
    """Admit version ``version`` of a document (a delta re-check of ``parent``)."""
    doc = f"<p>Version {version}: water boils at one hundred degrees [thermo].</p>"
    return admission.analysis_job_admit(
        user=user, title=version, doc_html=doc, sources=SOURCES, delta_of_job_id=parent
    ).id


def complete_and_save(user, job_id: int) -> None:
    assert processing.analysis_job_process(job_id=job_id) == "complete"
    durability.analysis_run_save(user=user, job_id=job_id)


def test_a_retry_of_a_superseded_failure_never_replaces_the_users_newer_result(settings):
    """The run holds v3; v2 (an older delta) had failed. Retrying v2 would admit it with
    a higher job id than v3, and the newest job wins: v2's older document would replace
    v3 and cost a credit. Refused, naming v3; nothing is written or charged."""
    user = funded_user(credits=10)
    v1 = versioned(user, "v1")
    complete_and_save(user, v1)
    v2 = versioned(user, "v2", parent=v1)
    with transaction.atomic():
        processing.job_fail(admission.lock_job(v2), reason="the core refused")
    v3 = versioned(user, "v3", parent=v1)
    complete_and_save(user, v3)
    balance = credit_balance(user_id=user.pk)
    run_id = AnalysisJob.objects.get(pk=v3).run_id

    for dry_run in (True, False):
        with pytest.raises(RetryRefused, match=f"superseded by job {v3} "):
            operations.analysis_job_retry(job_id=v2, actor="x", dry_run=dry_run)

    assert retryable_failed_jobs() == [v2]  # listed, so a replay shows why it is refused
    assert AnalysisJob.objects.filter(run_id=run_id).count() == 3
    assert AnalysisAudit.objects.count() == 0
    assert credit_balance(user_id=user.pk) == balance
    run = AnalysisRun.objects.get(pk=run_id)
    assert run.job_id == v3 and "Version v3" in run.doc_html


def test_a_retry_of_the_newest_failure_names_what_it_will_replace():
    user = funded_user(credits=10)
    v1 = versioned(user, "v1")
    complete_and_save(user, v1)
    v2 = versioned(user, "v2", parent=v1)
    with transaction.atomic():
        processing.job_fail(admission.lock_job(v2), reason="the core refused")

    dry = operations.analysis_job_retry(job_id=v2, actor="x", dry_run=True)
    assert (dry.outcome, dry.run_job_id, dry.run_saved_by) == ("would_retry", v1, "client")
    assert dry.replaces == f"replaces run {dry.run_id}'s job {v1} (saved by client)"

    retried = operations.analysis_job_retry(job_id=v2, actor="x")
    complete_and_save(user, retried.new_job_id)
    run = AnalysisRun.objects.get(pk=dry.run_id)
    assert run.job_id == retried.new_job_id and "Version v2" in run.doc_html
    audit = AnalysisAudit.objects.get(job_id=v2)
    assert audit.payload["replaced_job_id"] == v1


def test_a_first_failure_has_no_saved_result_to_replace():
    job = failed_job(funded_user(credits=2))
    dry = operations.analysis_job_retry(job_id=job.pk, actor="x", dry_run=True)
    assert dry.replaces == f"run {job.run_id} has no saved result yet"
