"""The admin lists every runs table read-only; its actions call the services."""

from __future__ import annotations

import pytest
from django.urls import reverse

from runs import services
from runs.models import AnalysisJob, CreditEntry, CreditKind, JobStatus
from tests.factories import UserFactory
from tests.runs.factories import DOC_HTML, SOURCES, AnalysisJobFactory, funded_user

pytestmark = pytest.mark.django_db

MODELS = (
    "analysisjob",
    "analysisrun",
    "runjudgement",
    "jobcitation",
    "corerun",
    "coredailyusage",
    "creditentry",
)


@pytest.fixture
def staff_client(client):
    admin = UserFactory(username="admin", is_staff=True, is_superuser=True)
    client.force_login(admin)
    return client


@pytest.mark.parametrize("model", MODELS)
def test_every_table_has_a_read_only_changelist(staff_client, model):
    AnalysisJobFactory()

    page = staff_client.get(reverse(f"admin:runs_{model}_changelist"))

    assert page.status_code == 200
    assert staff_client.get(reverse(f"admin:runs_{model}_add")).status_code == 403


def test_job_detail_shows_the_body_size_not_the_body(staff_client):
    job = AnalysisJobFactory()

    page = staff_client.get(reverse("admin:runs_analysisjob_change", args=[job.pk]))

    assert page.status_code == 200
    assert b"chars" in page.content and b"Thesis" not in page.content


def test_cancel_action_cancels_queued_jobs_and_refunds_them(staff_client):
    user = funded_user(credits=2)
    running, queued = (
        services.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)
        for _ in range(2)
    )

    staff_client.post(
        reverse("admin:runs_analysisjob_changelist"),
        {"action": "cancel_queued", "_selected_action": [running.id, queued.id]},
    )

    statuses = dict(AnalysisJob.objects.values_list("pk", "status"))
    assert statuses == {running.id: JobStatus.PENDING, queued.id: JobStatus.CANCELLED}
    assert CreditEntry.objects.filter(kind=CreditKind.REFUND).count() == 1
