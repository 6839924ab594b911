"""Every admin write action needs its permission: a staff user who may only view gets a
403 and nothing is written; a staff user with the permission runs it.

Fault model: a view-only staff user (every ``view_*`` permission, nothing else) posts an
action the menu does not offer them — refunding a job (a credit), cancelling a queued
job (a refund), requeueing or promoting jobs (procrastinate jobs), replaying pipeline
stages (reopened ledger rows, an audit entry, a job), revoking another user's token,
deleting accounts rows, retrying, cancelling or aborting procrastinate jobs, or pressing
the Sweeps page's buttons. Each is one row of ``ACTIONS`` / ``SWEEP_ACTIONS``; the
write is detected by a digest of every table's content, not by a count alone (a retry or
a revoke changes rows without adding any).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.contrib.auth.models import Permission
from django.db import connection
from django.urls import reverse

from accounts.models import ApiToken, Tenant, User
from accounts.services import api_token_create
from pipeline.models import PipelineRun
from queueing.enqueue import enqueue
from queueing.sweeps import request_sweep
from runs import admission, processing
from runs.models import AnalysisJob
from tests.factories import TenantFactory, UserFactory
from tests.pipeline.conftest import submit
from tests.runs.factories import DOC_HTML, SOURCES, funded_user

pytestmark = pytest.mark.django_db

DIGESTED_TABLES = (
    "tenants",
    "users",
    "api_tokens",
    "anfragen",
    "pipeline_runs",
    "audit_log",
    "analysis_jobs",
    "core_runs",
    "credit_ledger",
    "procrastinate_jobs",
)


def digest() -> dict[str, str]:
    """Each table's whole content, hashed: any insert, update or delete changes it."""
    found = {}
    with connection.cursor() as cursor:
        for table in DIGESTED_TABLES:
            cursor.execute(
                f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) "
                f"FROM {table} t"
            )
            found[table] = cursor.fetchone()[0]
    return found


@dataclass(frozen=True)
class Action:
    model: str  # app_label.model_name
    name: str
    needs: tuple[str, ...]  # the permissions that let a staff user run it
    target: str  # which seeded row it is run on


ACTIONS = [
    Action(
        "runs.analysisjob",
        "refund",
        ("runs.change_analysisjob", "runs.add_creditentry"),
        "done_job",
    ),
    Action(
        "runs.analysisjob",
        "cancel_queued",
        ("runs.change_analysisjob", "runs.add_creditentry"),
        "queued_job",
    ),
    Action("runs.analysisjob", "requeue", ("runs.change_analysisjob",), "lost_job"),
    Action("runs.analysisjob", "promote_queue", ("runs.change_analysisjob",), "stuck_job"),
    Action("pipeline.pipelinerun", "replay_stage", ("pipeline.change_pipelinerun",), "failed_run"),
    Action(
        "pipeline.pipelinerun",
        "force_replay_cascade",
        ("pipeline.change_pipelinerun",),
        "succeeded_run",
    ),
    Action("accounts.apitoken", "revoke", ("accounts.change_apitoken",), "token"),
    Action("accounts.apitoken", "delete_selected", ("accounts.delete_apitoken",), "token"),
    Action("accounts.user", "delete_selected", ("accounts.delete_user",), "other_user"),
    Action("accounts.tenant", "delete_selected", ("accounts.delete_tenant",), "empty_tenant"),
    Action(
        "procrastinate.procrastinatejob",
        "retry",
        ("procrastinate.change_procrastinatejob",),
        "failed_job",
    ),
    Action(
        "procrastinate.procrastinatejob",
        "cancel",
        ("procrastinate.change_procrastinatejob",),
        "todo_job",
    ),
]
SWEEP_ACTIONS = ["run", "dry_run"]


@pytest.fixture
def rows(storage_root):
    """One row for every action to act on, written through the services."""
    alice = funded_user(credits=5, username="alice", tenant=TenantFactory(slug="acme"))
    done = admission.analysis_job_admit(user=alice, title="T", doc_html=DOC_HTML, sources=SOURCES)
    processing.analysis_job_process(job_id=done.id)
    lost = admission.analysis_job_admit(user=alice, title="T", doc_html=DOC_HTML, sources=SOURCES)
    queued = admission.analysis_job_admit(user=alice, title="T", doc_html=DOC_HTML, sources=SOURCES)
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM procrastinate_jobs WHERE queueing_lock = %s",
            [f"exclusive/analysis:{lost.id}"],
        )
    bob = funded_user(credits=2, username="bob", tenant=alice.tenant)
    stuck = admission.analysis_job_admit(user=bob, title="T", doc_html=DOC_HTML, sources=SOURCES)
    # bob's first job went away without promoting his queue: a stuck queued job.
    second = admission.analysis_job_admit(user=bob, title="T", doc_html=DOC_HTML, sources=SOURCES)
    AnalysisJob.objects.filter(pk=stuck.id).update(status="cancelled")
    anfrage = submit(alice.tenant)
    failed = PipelineRun.objects.create(
        tenant=alice.tenant, anfrage=anfrage, stage="intake", status="failed", attempts=1
    )
    other = submit(alice.tenant)
    succeeded = PipelineRun.objects.create(
        tenant=alice.tenant, anfrage=other, stage="intake", status="success", attempts=1
    )
    api_token_create(user=bob)
    failed_job = enqueue("pipeline.extract", args={"anfrage_id": anfrage.id}, key=None)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'failed' WHERE id = %s", [failed_job.job_id]
        )
    # A job an operator may cancel (a sweep's: its next tick asks again); a stage's job
    # is refused (nothing else would do its work).
    todo_job = request_sweep("finished_jobs")
    return {
        "done_job": done.id,
        "queued_job": queued.id,
        "lost_job": lost.id,
        "stuck_job": second.id,
        "failed_run": failed.pk,
        "succeeded_run": succeeded.pk,
        "token": ApiToken.objects.get(user=bob).pk,
        "other_user": UserFactory(username="carol", tenant=alice.tenant).pk,
        "empty_tenant": Tenant.objects.create(slug="empty", name="Empty").pk,
        "failed_job": failed_job.job_id,
        "todo_job": todo_job.job_id,
    }


def staff(*permissions: str) -> User:
    """A staff user with every view permission plus ``permissions``."""
    user = UserFactory(username=f"staff{User.objects.count()}", is_staff=True)
    granted = list(Permission.objects.filter(codename__startswith="view_"))
    for name in permissions:
        app_label, codename = name.split(".")
        granted.append(Permission.objects.get(content_type__app_label=app_label, codename=codename))
    user.user_permissions.add(*granted)
    return User.objects.get(pk=user.pk)  # a fresh permission cache


def post_action(client, action: Action, pk: object, **extra: str):
    app_label, model = action.model.split(".")
    url = reverse(f"admin:{app_label}_{model}_changelist")
    return client.post(url, {"action": action.name, "_selected_action": [pk], **extra})


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: f"{a.model}.{a.name}")
def test_view_only_staff_get_403_and_nothing_is_written(client, rows, action):
    client.force_login(staff())
    before = digest()

    response = post_action(client, action, rows[action.target])

    assert response.status_code == 403
    assert digest() == before
    app_label, model = action.model.split(".")
    listing = client.get(reverse(f"admin:{app_label}_{model}_changelist"))
    assert listing.status_code == 200
    assert f'value="{action.name}"'.encode() not in listing.content


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: f"{a.model}.{a.name}")
def test_staff_with_the_permission_run_the_action(client, rows, action):
    client.force_login(staff(*action.needs))
    before = digest()

    response = post_action(client, action, rows[action.target])

    assert response.status_code in (200, 302)
    if action.name == "delete_selected":
        # Django's own action asks for a confirmation first: the permission let it through.
        assert response.status_code == 200 and b"Are you sure" in response.content
        return
    if action.name == "force_replay_cascade":
        # The forced replay lists what it will reset first, writing nothing; confirmed, it
        # replays.
        assert response.status_code == 200 and digest() == before
        response = post_action(client, action, rows[action.target], confirmed="yes")
        assert response.status_code == 302
    assert digest() != before


@pytest.mark.parametrize("action", SWEEP_ACTIONS)
def test_the_sweeps_page_needs_its_own_permission_to_press_a_button(client, action):
    url = reverse("admin:queueing_sweeps")
    viewer = staff()
    client.force_login(viewer)
    page = client.get(url)
    assert page.status_code == 200 and b'name="action"' not in page.content
    before = digest()

    response = client.post(url, {"sweep": "unsaved_runs", "action": action})

    assert response.status_code == 403
    assert digest() == before
    client.force_login(staff("queueing.run_sweeps"))
    assert b'name="action"' in client.get(url).content
    assert client.post(url, {"sweep": "unsaved_runs", "action": action}).status_code == 302
