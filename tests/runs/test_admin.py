"""The analyses' admin: every table renders read-only with rows present, filters and
searches work, and the actions (cancel, requeue, refund, promote, run a sweep now) call
the services, have their effect and say what happened."""

from __future__ import annotations

import datetime

import pytest
from django.contrib import admin
from django.db import connection
from django.urls import reverse
from django.utils import timezone
from procrastinate.contrib.django import app as procrastinate_app
from procrastinate.contrib.django.models import ProcrastinateJob

from runs import admission, durability, operations, processing
from runs.credits import credit_grant
from runs.models import (
    AnalysisAudit,
    AnalysisJob,
    AnalysisRun,
    CreditEntry,
    CreditKind,
    JobStatus,
    SavedBy,
)
from runs.selectors import credit_balance
from tests.conftest import jobs
from tests.factories import TenantFactory, UserFactory
from tests.runs.factories import DOC_HTML, SOURCES, AnalysisJobFactory, backdate, funded_user

pytestmark = pytest.mark.django_db

RUNS_MODELS = sorted(
    (model for model in admin.site._registry if model._meta.app_label == "runs"),
    key=lambda model: model._meta.model_name,
)
CHANGELIST = "admin:runs_analysisjob_changelist"


@pytest.fixture
def staff_client(client):
    admin_user = UserFactory(username="admin", is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    return client


def admit(user, title: str = "T"):
    return admission.analysis_job_admit(user=user, title=title, doc_html=DOC_HTML, sources=SOURCES)


@pytest.fixture
def seeded():
    """A row in every runs table, written by the services: a complete job with verdicts,
    its run (client save) and judgement, a queued job, core runs, usage and credits."""
    user = funded_user(credits=3, username="alice", tenant=TenantFactory(slug="acme"))
    done, queued_then_pending = admit(user, "first"), admit(user, "second")
    processing.analysis_job_process(job_id=done.id)
    recorded = durability.analysis_run_record(job_id=done.id, saved_by=SavedBy.CLIENT)
    durability.analysis_run_judge(run_id=recorded.run_id, version=recorded.version)
    queued = admit(user, "third")
    return {"user": user, "done": done.id, "pending": queued_then_pending.id, "queued": queued.id}


def act(client, action: str, *ids: int, **extra: str) -> list[str]:
    response = client.post(
        reverse(CHANGELIST),
        {"action": action, "_selected_action": list(ids), **extra},
        follow=True,
    )
    assert response.status_code == 200
    return [str(m) for m in response.context["messages"]]


def result_count(response) -> int:
    assert response.status_code == 200
    return response.context["cl"].result_count


def test_every_runs_table_is_registered():
    assert {m._meta.model_name for m in RUNS_MODELS} == {
        "analysisaudit",
        "analysisjob",
        "analysisrun",
        "runjudgement",
        "jobcitation",
        "corerun",
        "coredailyusage",
        "creditentry",
    }


@pytest.mark.parametrize("model", RUNS_MODELS, ids=lambda m: m._meta.model_name)
def test_every_table_renders_read_only_with_rows(staff_client, seeded, model):
    if model is AnalysisAudit:
        credit_grant(user_id=seeded["user"].pk, amount=2)
        failed = admit(seeded["user"])
        AnalysisJob.objects.filter(pk=failed.id).update(status=JobStatus.FAILED)
        operations.analysis_job_retry(job_id=failed.id, actor="admin:alice")
    name = model._meta.model_name
    model_admin = admin.site._registry[model]
    changelist = reverse(f"admin:runs_{name}_changelist")

    assert result_count(staff_client.get(changelist)) >= 1
    # Ids, uuids and words alike: an exact id search never fails on a word.
    for term in ("alice", str(seeded["done"]), "not-a-uuid", "'"):
        assert staff_client.get(changelist, {"q": term}).status_code == 200
    if model_admin.date_hierarchy:
        field = model_admin.date_hierarchy
        year = timezone.localdate().year
        assert result_count(staff_client.get(changelist, {f"{field}__year": year})) >= 1
    row = model.objects.first()
    page = staff_client.get(reverse(f"admin:runs_{name}_change", args=[row.pk]))
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert staff_client.get(reverse(f"admin:runs_{name}_add")).status_code == 403


def test_job_pages_show_the_body_size_not_the_body(staff_client):
    job = AnalysisJobFactory()

    page = staff_client.get(reverse("admin:runs_analysisjob_change", args=[job.pk]))

    assert page.status_code == 200
    assert f"{len(DOC_HTML):,} chars".encode() in page.content
    assert b"Thesis" not in page.content
    AnalysisJob.objects.filter(pk=job.pk).update(doc_html=None)
    page = staff_client.get(reverse("admin:runs_analysisjob_change", args=[job.pk]))
    assert b"trimmed" in page.content


def test_filters_by_status_user_tenant_kind_and_saved_by(staff_client, seeded):
    other = funded_user(credits=1, username="bob", tenant=TenantFactory(slug="globex"))
    admit(other)
    legacy = AnalysisJobFactory(user=other)
    durability.analysis_run_record(job_id=legacy.pk, saved_by=SavedBy.WORKER)
    AnalysisRun.objects.filter(job_id=legacy.pk).update(saved_by=None)
    job_list = reverse(CHANGELIST)

    assert result_count(staff_client.get(job_list)) == 5
    assert result_count(staff_client.get(job_list, {"status": "queued"})) == 1
    assert result_count(staff_client.get(job_list, {"status": "pending"})) == 2
    assert result_count(staff_client.get(job_list, {"user__id__exact": other.pk})) == 2
    assert result_count(staff_client.get(job_list, {"tenant__id__exact": other.tenant_id})) == 2
    assert result_count(staff_client.get(job_list, {"delta": "yes"})) == 0
    assert result_count(staff_client.get(job_list, {"q": "bob"})) == 2
    assert result_count(staff_client.get(job_list, {"created_at__year": 2001})) == 0
    queued_page = staff_client.get(job_list, {"status": "queued"})
    assert b'<td class="field-position">1</td>' in queued_page.content

    run_list = reverse("admin:runs_analysisrun_changelist")
    assert result_count(staff_client.get(run_list, {"saved_by": "client"})) == 1
    assert result_count(staff_client.get(run_list, {"saved_by__isnull": "True"})) == 1
    assert b"legacy (client)" in staff_client.get(run_list).content
    credits = reverse("admin:runs_creditentry_changelist")
    assert result_count(staff_client.get(credits, {"kind": "grant"})) == 2
    assert (
        result_count(staff_client.get(credits, {"user__tenant__id__exact": other.tenant_id})) == 2
    )


def test_jobs_and_runs_link_their_procrastinate_jobs(staff_client, seeded):
    job_list = staff_client.get(reverse(CHANGELIST)).content
    pending = seeded["pending"]
    link = f"procrastinatejob/?queueing_lock=exclusive%2Fanalysis%3A{pending}"
    assert link.encode() in job_list

    listed = staff_client.get(
        "/admin/procrastinate/procrastinatejob/",
        {"queueing_lock": f"exclusive/analysis:{pending}"},
    )
    assert listed.status_code == 200
    [found] = listed.context["cl"].result_list
    assert (found.task_name, found.args["job_id"]) == ("runs.process_job", pending)

    run = AnalysisRun.objects.get()
    run_list = staff_client.get(reverse("admin:runs_analysisrun_changelist")).content
    assert f"exclusive%2Frun_judge%3A{run.pk}%3A1".encode() in run_list


def test_cancel_action_cancels_queued_jobs_only_and_refunds_them(staff_client):
    user = funded_user(credits=2)
    running, queued = admit(user), admit(user)

    messages = act(staff_client, "cancel_queued", running.id, queued.id)

    statuses = dict(AnalysisJob.objects.values_list("pk", "status"))
    assert statuses == {running.id: JobStatus.PENDING, queued.id: JobStatus.CANCELLED}
    assert CreditEntry.objects.filter(kind=CreditKind.REFUND).count() == 1
    assert messages == [
        "Cancelled 1 queued job(s) and refunded their credit; "
        "1 job(s) were not queued and were left alone."
    ]
    assert act(staff_client, "cancel_queued", queued.id) == [
        "Cancelled 0 queued job(s) and refunded their credit; "
        "1 job(s) were not queued and were left alone."
    ]
    assert CreditEntry.objects.filter(kind=CreditKind.REFUND).count() == 1


def test_requeue_enqueues_a_lost_active_job_once_and_never_a_terminal_one(staff_client, seeded):
    pending, done = seeded["pending"], seeded["done"]
    lock = f"exclusive/analysis:{pending}"
    # The job's task is lost (its worker died, the job row was cleaned up).
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs WHERE queueing_lock = %s", [lock])
    others = jobs(task_name="runs.process_job")

    first = act(staff_client, "requeue", pending, done, seeded["queued"])
    second = act(staff_client, "requeue", pending)

    assert first == [
        "Requeue: 1 requeued; 2 not requeued: queued (waiting for their turn) or already finished."
    ]
    assert second == ["Requeue: 1 already had their job waiting, retrying or running."]
    assert [j["args"]["job_id"] for j in jobs(queueing_lock=lock)] == [pending]
    assert jobs(task_name="runs.process_job") == [*others, *jobs(queueing_lock=lock)]


def test_refund_gives_a_finished_job_its_credit_back_exactly_once(staff_client, seeded):
    user, done = seeded["user"], seeded["done"]
    before = credit_balance(user_id=user.pk)

    first = act(staff_client, "refund", done, seeded["pending"], seeded["queued"])
    second = act(staff_client, "refund", done)

    assert first == ["Refund: 1 refunded; 2 not finished yet (cancel or wait)."]
    assert second == ["Refund: 1 already refunded (nothing added)."]
    [refund] = CreditEntry.objects.filter(kind=CreditKind.REFUND)
    assert (refund.job_id, refund.amount, refund.note) == (done, 1, "refunded by admin:admin")
    assert credit_balance(user_id=user.pk) == before + 1


def test_refund_service_refuses_what_was_never_charged_and_a_missing_job():
    uncharged = AnalysisJobFactory()

    assert (
        operations.analysis_job_refund(job_id=uncharged.pk) == operations.RefundOutcome.NOT_CHARGED
    )
    assert operations.analysis_job_refund(job_id=10**9) == operations.RefundOutcome.MISSING
    assert not CreditEntry.objects.filter(kind=CreditKind.REFUND).exists()


def test_a_failed_job_refunded_at_failure_is_not_refunded_again(staff_client):
    user = funded_user(credits=1)
    job = admit(user)
    AnalysisJob.objects.filter(pk=job.id).update(status=JobStatus.RUNNING)
    AnalysisJob.objects.filter(pk=job.id).update(
        release_deadline=timezone.now() - datetime.timedelta(seconds=1)
    )
    assert processing.analysis_job_give_up(job_id=job.id)

    assert act(staff_client, "refund", job.id) == ["Refund: 1 already refunded (nothing added)."]
    assert CreditEntry.objects.filter(kind=CreditKind.REFUND).count() == 1


def test_promote_action_says_when_there_was_nothing_to_promote(staff_client, seeded):
    assert act(staff_client, "promote_queue", seeded["queued"]) == [
        "Promoted 0 job(s) for 1 user(s) (each already has an active job or nothing queued)."
    ]


def test_run_a_sweep_now_queues_the_job_that_records_an_unsaved_run(staff_client, settings):
    job = AnalysisJobFactory()
    backdate("analysis_jobs", [job.pk], seconds=settings.SWEEP_GRACE_SECONDS + 1)

    response = staff_client.post(
        reverse("admin:queueing_sweeps"), {"sweep": "unsaved_runs", "action": "run"}, follow=True
    )

    [message] = [str(m) for m in response.context["messages"]]
    assert message.startswith("Sweep unsaved_runs queued for a worker as job ")
    assert not AnalysisRun.objects.exists()  # nothing ran inside the web request
    [queued] = ProcrastinateJob.objects.filter(task_name="queueing.sweep.unsaved_runs")
    procrastinate_app.tasks[queued.task_name]()  # what a worker runs for it
    assert AnalysisRun.objects.get().saved_by == SavedBy.WORKER


def test_no_run_yet_filter_finds_finished_unsaved_jobs_by_age(staff_client, settings):
    settings.SWEEP_GRACE_SECONDS = 120
    fresh, stale, old = AnalysisJobFactory(), AnalysisJobFactory(), AnalysisJobFactory()
    saved = AnalysisJobFactory()
    durability.analysis_run_record(job_id=saved.pk, saved_by=SavedBy.CLIENT)
    backdate("analysis_jobs", [stale.pk], seconds=600, columns=("finished_at",))
    backdate("analysis_jobs", [old.pk], seconds=3 * 86400, columns=("finished_at",))
    job_list = reverse(CHANGELIST)

    def ids(value: str) -> set[int]:
        page = staff_client.get(job_list, {"no_run": value})
        assert page.status_code == 200
        return {row.pk for row in page.context["cl"].result_list}

    assert ids("any") == {fresh.pk, stale.pk, old.pk}
    assert ids("under_grace") == {fresh.pk}
    assert ids("under_1h") == {stale.pk}
    assert ids("under_24h") == set()
    assert ids("over_24h") == {old.pk}
    assert b"no run yet, past the grace period" in staff_client.get(job_list).content


def test_retry_action_retries_failed_jobs_once_and_names_refusals(staff_client):
    user = funded_user(credits=3)
    failed, pending = admit(user), admit(user, "second")
    AnalysisJob.objects.filter(pk=failed.id).update(status=JobStatus.FAILED)

    first = act(staff_client, "retry_failed", failed.id, pending.id, confirm="yes")
    again = act(staff_client, "retry_failed", failed.id, confirm="yes")

    assert first == [
        f"Retry: 1 retried; 1 refused (#{pending.id}: job {pending.id} is queued; only "
        "failed analyses are retried)."
    ]
    assert again == ["Retry: 1 already retried (nothing added)."]
    entry = AnalysisAudit.objects.get()
    assert (entry.job_id, entry.actor) == (failed.id, "admin:admin")
    audit_list = staff_client.get(reverse("admin:runs_analysisaudit_changelist"))
    assert result_count(audit_list) == 1


def test_the_sweeps_page_names_environment_variables_and_counts_runs_not_saved(
    staff_client, settings
):
    settings.SWEEP_GRACE_SECONDS = 120
    AnalysisJobFactory()
    late = AnalysisJobFactory()
    backdate("analysis_jobs", [late.pk], seconds=600, columns=("finished_at",))

    page = staff_client.get(reverse("admin:queueing_sweeps")).content.decode()

    assert "<code>STALLED_WORKER_SECONDS</code>" in page
    assert "QUEUEING_STALLED_WORKER_SECONDS" not in page
    assert "<code>SWEEP_GRACE_SECONDS</code>" in page
    assert 'id="unsaved-runs-total">2</a>' in page
    assert "1 past the 120 s grace period" in page
    assert "?no_run=under_1h" in page


def test_retry_action_first_shows_what_each_retry_would_replace_and_changes_nothing(
    staff_client, failed_deltas
):
    v1, v2, v3 = failed_deltas.saved, failed_deltas.superseded, failed_deltas.latest
    run_id = failed_deltas.run_id
    balance = credit_balance(user_id=failed_deltas.user.pk)

    page = staff_client.post(
        reverse(CHANGELIST), {"action": "retry_failed", "_selected_action": [v2, v3]}
    )

    assert page.status_code == 200
    rows = {r["job_id"]: (r["outcome"], r["detail"]) for r in page.context["rows"]}
    assert rows[v2][0] == "refused" and f"superseded by job {v3}" in rows[v2][1]
    assert rows[v3] == ("would retry", f"replaces run {run_id}'s job {v1} (saved by client)")
    assert b'name="confirm" value="yes"' in page.content and b"Retry 1 job(s)" in page.content
    assert AnalysisAudit.objects.count() == 0
    assert AnalysisJob.objects.count() == 3
    assert credit_balance(user_id=failed_deltas.user.pk) == balance
