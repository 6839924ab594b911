"""Every admin action of every app needs its permission, tried at every permission level:
refused (403, not offered in the menu, nothing written) unless the user holds every
permission the action needs; then it runs.

Fault model: a staff user at each level — view-only (every ``view_*`` permission, nothing
else), allowed to change the action's model but nothing more, holding exactly what the
action needs, superuser — posts each action the admin site declares: refunding a job or
cancelling a queued one (a credit), retrying a failed analysis (a new job and a charge),
requeueing or promoting jobs (procrastinate jobs), replaying pipeline stages (reopened
ledger rows, an audit entry, a job), revoking or deleting accounts rows, retrying or
cancelling procrastinate jobs, deleting rows of a table the system owns, or pressing the
Sweeps page's buttons. ``EXPECTED`` classifies every declared action and a test checks it
names exactly the declared ones, so a new action fails here until it is classified; the
write is detected by a digest of every table's content, not by a count alone (a retry or
a revoke changes rows without adding any).
"""

from __future__ import annotations

import re

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.auth.models import Group, Permission
from django.db import connection
from django.urls import reverse
from django.utils import timezone

from accounts.models import ApiToken, AuthFailure, Tenant, User
from accounts.services import api_token_create
from pipeline.models import Catalog, PipelineRun
from queueing.enqueue import enqueue
from queueing.sweeps import request_sweep
from runs import admission, durability, operations, processing
from runs.models import AnalysisJob, AnalysisRun, RunJudgement, SavedBy
from tests.conftest import ROOT
from tests.factories import TenantFactory, UserFactory
from tests.pipeline.conftest import run_stages, submit
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
    "catalogs",
    "auth_group",
    "auth_failures",
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


#: Every admin action of every registered model, with the permissions that let a staff
#: user run it (``None``: nobody, not even a superuser — the table is read-only, its rows
#: are the system's). The table must name exactly the actions the admin site declares,
#: so a new action is refused by this test until it is classified here.
EXPECTED: dict[tuple[str, str], tuple[str, ...] | None] = {
    ("auth.group", "delete_selected"): ("auth.delete_group",),
    ("accounts.tenant", "delete_selected"): ("accounts.delete_tenant",),
    ("accounts.user", "delete_selected"): ("accounts.delete_user",),
    ("accounts.apitoken", "delete_selected"): ("accounts.delete_apitoken",),
    ("accounts.apitoken", "revoke"): ("accounts.change_apitoken",),
    ("accounts.authfailure", "delete_selected"): ("accounts.delete_authfailure",),
    ("accounts.authfailure", "reset"): ("accounts.delete_authfailure",),
    ("procrastinate.procrastinatejob", "delete_selected"): None,
    ("procrastinate.procrastinatejob", "retry"): ("procrastinate.change_procrastinatejob",),
    ("procrastinate.procrastinatejob", "cancel"): ("procrastinate.change_procrastinatejob",),
    ("pipeline.anfrage", "delete_selected"): None,
    ("pipeline.pipelinerun", "delete_selected"): None,
    ("pipeline.pipelinerun", "replay_stage"): ("pipeline.change_pipelinerun",),
    ("pipeline.pipelinerun", "force_replay_cascade"): ("pipeline.change_pipelinerun",),
    ("pipeline.position", "delete_selected"): None,
    ("pipeline.anfragefile", "delete_selected"): None,
    ("pipeline.extractionwarning", "delete_selected"): None,
    ("pipeline.auditentry", "delete_selected"): None,
    ("pipeline.catalog", "delete_selected"): ("pipeline.delete_catalog",),
    ("runs.analysisjob", "delete_selected"): None,
    ("runs.analysisjob", "cancel_queued"): ("runs.change_analysisjob", "runs.add_creditentry"),
    ("runs.analysisjob", "requeue"): ("runs.change_analysisjob",),
    ("runs.analysisjob", "refund"): ("runs.change_analysisjob", "runs.add_creditentry"),
    ("runs.analysisjob", "promote_queue"): ("runs.change_analysisjob",),
    # It admits a new job and charges its user a credit.
    ("runs.analysisjob", "retry_failed"): ("runs.change_analysisjob", "runs.add_creditentry"),
    ("runs.analysisaudit", "delete_selected"): None,
    ("runs.analysisrun", "delete_selected"): None,
    ("runs.runjudgement", "delete_selected"): None,
    ("runs.jobcitation", "delete_selected"): None,
    ("runs.corerun", "delete_selected"): None,
    ("runs.coredailyusage", "delete_selected"): None,
    ("runs.creditentry", "delete_selected"): None,
}
#: The seeded row each action runs on (the others run on any row of their table).
TARGETS = {
    ("runs.analysisjob", "refund"): "done_job",
    ("runs.analysisjob", "cancel_queued"): "queued_job",
    ("runs.analysisjob", "requeue"): "lost_job",
    ("runs.analysisjob", "promote_queue"): "stuck_job",
    ("runs.analysisjob", "retry_failed"): "failed_analysis",
    ("pipeline.pipelinerun", "replay_stage"): "failed_run",
    ("pipeline.pipelinerun", "force_replay_cascade"): "succeeded_run",
    ("accounts.apitoken", "revoke"): "token",
    ("accounts.apitoken", "delete_selected"): "token",
    ("accounts.authfailure", "reset"): "auth_failure",
    ("accounts.authfailure", "delete_selected"): "auth_failure",
    ("accounts.user", "delete_selected"): "other_user",
    ("accounts.tenant", "delete_selected"): "empty_tenant",
    ("procrastinate.procrastinatejob", "retry"): "failed_job",
    ("procrastinate.procrastinatejob", "cancel"): "todo_job",
    ("procrastinate.procrastinatejob", "delete_selected"): "todo_job",
}
#: The permission levels every action is tried at: view-only staff, staff who may also
#: change the action's model, staff with exactly the permissions the action needs, and a
#: superuser.
LEVELS = ("view", "change", "needed", "superuser")
SWEEP_ACTIONS = ["run", "dry_run"]


def declared_actions() -> dict[tuple[str, str], object]:
    """Every action the admin site declares, with its function."""
    return {
        (model._meta.label_lower, name): func
        for model, model_admin in admin.site._registry.items()
        for func, name, _ in model_admin._get_base_actions()
    }


def granted(level: str, key: tuple[str, str]) -> tuple[str, ...]:
    app_label, model = key[0].split(".")
    if level == "change":
        return (f"{app_label}.change_{model}",)
    if level == "needed":
        return EXPECTED[key] or ()
    return ()


CASES = [
    pytest.param(key, level, id=f"{key[0]}.{key[1]}-{level}")
    for key in EXPECTED
    for level in LEVELS
    # "needed" is "view" for an action nobody may run, "change" when that is all it needs.
    if not (level == "needed" and granted("needed", key) in ((), granted("change", key)))
]


@pytest.fixture
def rows(storage_root):
    """One row for every action to act on, written through the services."""
    alice = funded_user(credits=7, username="alice", tenant=TenantFactory(slug="acme"))
    done = admission.analysis_job_admit(user=alice, title="T", doc_html=DOC_HTML, sources=SOURCES)
    processing.analysis_job_process(job_id=done.id)
    durability.analysis_run_record(job_id=done.id, saved_by=SavedBy.CLIENT)
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
    anfrage = submit(alice.tenant, {"items.txt": "2 pcs steel beam HEA 200, 6 m\nnonsense\n"})
    run_stages(anfrage.id)
    Group.objects.create(name="operators")
    Catalog.objects.create(tenant=alice.tenant, name="Acme")
    failed = PipelineRun.objects.create(
        tenant=alice.tenant,
        anfrage=submit(alice.tenant),
        stage="intake",
        status="failed",
        attempts=1,
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
    failed_analysis = admission.analysis_job_admit(
        user=alice, title="T", doc_html=DOC_HTML, sources=SOURCES
    )
    retried = admission.analysis_job_admit(
        user=alice, title="T", doc_html=DOC_HTML, sources=SOURCES
    )
    AnalysisJob.objects.filter(pk__in=[failed_analysis.id, retried.id]).update(status="failed")
    operations.analysis_job_retry(job_id=retried.id, actor="test")  # an audit entry
    RunJudgement.objects.create(
        run=AnalysisRun.objects.get(), version=1, summary={}, judged_at=timezone.now()
    )
    failure = AuthFailure.objects.create(
        scope="login", address="198.51.100.3", window_start=timezone.now(), failures=12
    )
    return {
        "auth_failure": failure.pk,
        "failed_analysis": failed_analysis.id,
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


#: Actions that first show what they will do (writing nothing), and the field that confirms.
CONFIRMATIONS = {
    ("pipeline.pipelinerun", "force_replay_cascade"): {"confirmed": "yes"},
    ("runs.analysisjob", "retry_failed"): {"confirm": "yes"},
}


def post_action(client, key: tuple[str, str], pk: object, **extra: str):
    app_label, model = key[0].split(".")
    url = reverse(f"admin:{app_label}_{model}_changelist")
    return client.post(url, {"action": key[1], "_selected_action": [pk], **extra})


def target(rows: dict, key: tuple[str, str]) -> object:
    if key in TARGETS:
        return rows[TARGETS[key]]
    model = apps.get_model(key[0])
    return model.objects.values_list("pk", flat=True).order_by("pk").first()


def test_the_table_names_every_action_and_every_action_declares_its_permissions():
    declared = declared_actions()

    assert set(declared) == set(EXPECTED)
    undeclared = [
        key for key, func in declared.items() if not getattr(func, "allowed_permissions", ())
    ]
    assert undeclared == []


@pytest.mark.parametrize(("key", "level"), CASES)
def test_every_action_at_every_permission_level(client, rows, key, level):
    """Refused (403, not in the menu, nothing written) unless the level holds every
    permission the action needs; then it runs (or, Django's delete, asks to confirm)."""
    needs = EXPECTED[key]
    if level == "superuser":
        user = UserFactory(username="root", is_staff=True, is_superuser=True)
        allowed = needs is not None
    else:
        user = staff(*granted(level, key))
        allowed = needs is not None and set(needs) <= set(granted(level, key))
    client.force_login(user)
    pk = target(rows, key)
    assert pk is not None, f"no row to run {key} on"
    app_label, model = key[0].split(".")
    listing = client.get(reverse(f"admin:{app_label}_{model}_changelist"))
    assert listing.status_code == 200
    offered = f'value="{key[1]}"'.encode() in listing.content
    before = digest()

    response = post_action(client, key, pk)

    if not allowed:
        assert response.status_code == 403
        assert digest() == before
        assert not offered
    elif key[1] == "delete_selected":
        assert response.status_code == 200 and b"Are you sure" in response.content
        assert offered
    elif key in CONFIRMATIONS:
        # It lists what it will do first, writing nothing; confirmed, it runs.
        assert response.status_code == 200 and digest() == before
        response = post_action(client, key, pk, **CONFIRMATIONS[key])
        assert response.status_code == 302 and digest() != before
        assert offered
    else:
        assert response.status_code in (200, 302)
        assert digest() != before
        assert offered


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


def test_docs_security_lists_the_permissions_each_action_needs():
    """docs/security.md's table: every action's set of permissions is a row's, and every
    row's is an action's (Django's delete and the Sweeps page's buttons aside)."""
    page = (ROOT / "docs" / "security.md").read_text()
    table = page.split("| page | action | permission |", 1)[1].split("\n\n", 1)[0]
    rows = [row.strip("|").split(" | ") for row in table.strip().splitlines()[1:]]
    documented = {
        frozenset(re.findall(r"`(\w+\.\w+)`", permission))
        for _, action, permission in rows
        if "Delete" not in action and "Run now" not in action
    }
    needed = {
        frozenset(needs)
        for (_, action), needs in EXPECTED.items()
        if needs is not None and action != "delete_selected"
    }
    assert documented == needed
