"""The admin pages render and the replay action calls the replay service."""

from __future__ import annotations

import pytest
from django.db import connection

from pipeline.models import AuditEntry, PipelineRun
from tests.conftest import jobs
from tests.factories import UserFactory
from tests.pipeline.conftest import run_stages, submit


@pytest.fixture
def admin_client(client, tenant):
    user = UserFactory(username="root", tenant=tenant, is_staff=True, is_superuser=True)
    client.force_login(user)
    return client


@pytest.mark.parametrize(
    "page",
    [
        "anfrage",
        "pipelinerun",
        "position",
        "anfragefile",
        "extractionwarning",
        "auditentry",
        "catalog",
    ],
)
def test_changelists_render(admin_client, tenant, page):
    anfrage = submit(tenant, {"a.txt": "12 pcs steel beam HEA 200, 6 m\nhuh\n"})
    run_stages(anfrage.id)
    response = admin_client.get(f"/admin/pipeline/{page}/", {"q": "beam"})
    assert response.status_code == 200
    assert admin_client.get(f"/admin/pipeline/{page}/").status_code == 200


def test_filters_and_read_only_detail(admin_client, tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    response = admin_client.get(
        "/admin/pipeline/pipelinerun/",
        {"stage": "extract", "status": "success", "tenant__id__exact": tenant.id},
    )
    assert response.status_code == 200
    assert admin_client.get(f"/admin/pipeline/anfrage/{anfrage.id}/change/").status_code == 200
    entry = AuditEntry.objects.first()
    response = admin_client.get(f"/admin/pipeline/auditentry/{entry.id}/change/")
    assert response.status_code == 200 and b"Save" not in response.content
    assert admin_client.get("/admin/pipeline/auditentry/add/").status_code == 403


def test_replay_actions(admin_client, tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_jobs")
    run = PipelineRun.objects.get(anfrage=anfrage, stage="feasibility")
    # A successful stage is refused by the plain action (it needs force) ...
    response = admin_client.post(
        "/admin/pipeline/pipelinerun/",
        {"action": "replay_stage", "_selected_action": [run.id]},
        follow=True,
    )
    assert b"pass --force" in response.content
    assert jobs() == []
    # ... and replayed by the forced one, which cascades.
    admin_client.post(
        "/admin/pipeline/pipelinerun/",
        {"action": "force_replay_cascade", "_selected_action": [run.id]},
    )
    assert [j["task_name"] for j in jobs()] == ["pipeline.feasibility"]
    [entry] = AuditEntry.objects.filter(action="stage.replayed")
    assert entry.actor == "admin:root" and entry.payload["reopened"] == ["feasibility", "calculate"]
