"""/metrics: access control and the values of every metric, on real PostgreSQL."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from queueing.metrics import sources
from queueing.sweeps import run_sweep
from runs.models import CreditEntry, CreditKind, SavedBy
from tests.conftest import ROOT
from tests.site.conftest import admit, funded_user, inquiry, process, run_row, stage_run

pytestmark = pytest.mark.django_db

TOKEN = "s3cret-metrics-token"


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: dict, name: str, **labels) -> float:
    return found[(name, frozenset(labels.items()))]


@pytest.fixture
def scrape(client, settings):
    settings.METRICS_TOKEN = TOKEN

    def get() -> dict:
        response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200, response.content
        assert response["Content-Type"].startswith("text/plain")
        return samples(response.content.decode())

    return get


def test_anonymous_gets_401_json(client, settings):
    settings.METRICS_TOKEN = TOKEN
    response = client.get("/metrics")
    assert response.status_code == 401
    assert response.json()["error"] == "unauthenticated"
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_head_answers_as_get_does_without_a_body(client, settings):
    """A probe that checks the endpoint with HEAD gets GET's status and no body."""
    settings.METRICS_TOKEN = TOKEN
    assert client.head("/metrics").status_code == 401
    response = client.head("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    assert response.content == b""


def test_wrong_token_gets_403(client, settings):
    settings.METRICS_TOKEN = TOKEN
    response = client.get("/metrics", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


def test_without_configured_token_no_bearer_is_accepted(client, settings):
    settings.METRICS_TOKEN = ""
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"Authorization": "Bearer "}).status_code == 403


def test_a_session_needs_the_view_metrics_permission(client, settings, tenant):
    from django.contrib.auth.models import Permission

    settings.METRICS_TOKEN = ""
    user = funded_user(tenant, "plain", credits=0)
    client.force_login(user)
    assert client.get("/metrics").status_code == 403
    # Staff alone is not enough: the metrics show every tenant's volumes.
    user.is_staff = True
    user.save()
    response = client.get("/metrics")
    assert response.status_code == 403
    assert "queueing.view_metrics" in response.json()["detail"]
    user.user_permissions.add(
        Permission.objects.get(content_type__app_label="queueing", codename="view_metrics")
    )
    user = type(user).objects.get(pk=user.pk)  # a fresh permission cache
    client.force_login(user)
    assert client.get("/metrics").status_code == 200


def test_a_superuser_session_may_read(client, settings, tenant):
    settings.METRICS_TOKEN = ""
    user = funded_user(tenant, "root", credits=0)
    user.is_staff = user.is_superuser = True
    user.save()
    client.force_login(user)
    assert client.get("/metrics").status_code == 200


def test_metrics_report_the_rows_in_the_database(scrape, tenant):
    alice = funded_user(tenant, "alice")
    first = admit(alice, "first")
    admit(alice, "second")
    process(first)  # first completes, second is promoted to pending
    CreditEntry.objects.create(user=alice, job=first, kind=CreditKind.REFUND, amount=1)

    run_row(alice, title="a", saved_by=SavedBy.WORKER)
    run_row(alice, title="b", saved_by=SavedBy.WORKER)
    run_row(alice, title="c", saved_by=SavedBy.CLIENT)
    run_row(alice, title="d", saved_by=None)

    one, two = inquiry(tenant, "one"), inquiry(tenant, "two")
    stage_run(one, "extract", "success", seconds=2)
    stage_run(two, "extract", "success", seconds=4)
    stage_run(one, "calculate", "failed", seconds=1.5, error="boom")
    stage_run(two, "calculate", "running")

    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args) VALUES "
            "('metrics-q', 't', 'todo', '{}'), ('metrics-q', 't', 'todo', '{}'), "
            "('metrics-q', 't', 'failed', '{}')"
        )

    run_sweep("metrics_snapshot")  # the history's counts, taken once a minute
    found = scrape()

    assert value(found, "pgstage_metrics_snapshot_age_seconds") >= 0
    assert value(found, "pgstage_queue_depth", queue="metrics-q") == 2
    assert value(found, "pgstage_jobs", queue="metrics-q", status="todo") == 2
    assert value(found, "pgstage_jobs", queue="metrics-q", status="failed") == 1
    assert value(found, "pgstage_jobs", queue="metrics-q", status="doing") == 0
    # The promoted second job's process_job waits in the analyses queue.
    assert value(found, "pgstage_queue_depth", queue="analyses") >= 1

    assert value(found, "pgstage_analysis_jobs", status="complete") == 1
    assert value(found, "pgstage_analysis_jobs", status="pending") == 1

    assert value(found, "pgstage_refunds_total") == 1
    assert value(found, "pgstage_refunded_credits_total") == 1

    assert value(found, "pgstage_analysis_runs", saved_by="worker") == 2
    assert value(found, "pgstage_analysis_runs", saved_by="client") == 1
    assert value(found, "pgstage_analysis_runs", saved_by="legacy") == 1
    assert value(found, "pgstage_sweep_rescues_total") == 2

    assert value(found, "pgstage_pipeline_runs", stage="extract", status="success") == 2
    assert value(found, "pgstage_pipeline_runs", stage="calculate", status="running") == 1
    duration = "pgstage_pipeline_stage_duration_seconds"
    assert value(found, f"{duration}_count", stage="extract", status="success") == 2
    assert value(found, f"{duration}_sum", stage="extract", status="success") == pytest.approx(6)
    assert value(found, f"{duration}_count", stage="calculate", status="failed") == 1
    assert value(found, f"{duration}_sum", stage="calculate", status="failed") == pytest.approx(1.5)
    # A running stage has no duration yet.
    assert (
        f"{duration}_count",
        frozenset({"stage": "calculate", "status": "running"}.items()),
    ) not in found


def test_empty_database_still_exposes_every_metric_family(scrape):
    text_names = {name for name, _ in scrape()}
    assert {
        "pgstage_refunds_total",
        "pgstage_refunded_credits_total",
        "pgstage_sweep_rescues_total",
        "pgstage_analysis_runs",
    } <= text_names
    found = scrape()
    for age in ("under_grace", "under_1h", "under_24h", "over_24h"):
        assert value(found, "pgstage_unsaved_runs", age=age) == 0


def test_unsaved_runs_gauge_counts_finished_jobs_without_a_run_by_age(scrape, tenant, settings):
    settings.SWEEP_GRACE_SECONDS = 120
    alice = funded_user(tenant, "alice")
    fresh, late = process(admit(alice, "fresh")), process(admit(alice, "late"))
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE analysis_jobs SET finished_at = finished_at - interval '10 minutes' "
            "WHERE id = %s",
            [late.pk],
        )
    found = scrape()
    assert value(found, "pgstage_unsaved_runs", age="under_grace") == 1
    assert value(found, "pgstage_unsaved_runs", age="under_1h") == 1
    assert value(found, "pgstage_unsaved_runs", age="over_24h") == 0
    assert fresh.status == "complete"


def test_admission_rejections_are_counted_by_reason_and_write_nothing(client, scrape, tenant):
    from runs.models import AnalysisJob
    from tests.factories import UserFactory, auth_header

    def rejections(reason: str) -> float:
        return scrape().get(
            ("pgstage_admission_rejections_total", frozenset({"reason": reason}.items())), 0.0
        )

    broke = UserFactory(tenant=tenant)  # no credits granted
    headers = auth_header(broke)
    before_credits = rejections("insufficient_credits")
    before_payload = rejections("invalid_payload")
    payload = {
        "title": "t",
        "doc_html": "<p>Claim [1].</p>",
        "sources": [{"key": "1", "title": "S", "doi": "10.1000/x.1", "text": "Claim."}],
    }
    response = client.post(
        "/api/analysis-jobs", payload, content_type="application/json", headers=headers
    )
    assert response.status_code == 402
    response = client.post(
        "/api/analysis-jobs", {"title": 1}, content_type="application/json", headers=headers
    )
    assert response.status_code == 422
    # An unauthenticated call is not an admission rejection.
    client.post("/api/analysis-jobs", payload, content_type="application/json")
    assert rejections("insufficient_credits") == before_credits + 1
    assert rejections("invalid_payload") == before_payload + 1
    assert rejections("unauthenticated") == 0.0
    assert not AnalysisJob.objects.filter(user=broke).exists()


def test_jobs_no_live_worker_can_run_are_a_gauge_per_task(scrape):
    from queueing.enqueue import enqueue

    enqueue("runs.process_job", args={"job_id": 1, "tenant": 1})
    enqueue("runs.process_job", args={"job_id": 2, "tenant": 1})
    # No worker runs in this test: nobody has the task.
    assert value(scrape(), "pgstage_jobs_without_worker", task="runs.process_job") == 2


def test_stages_waiting_for_a_replay_are_counted_as_waiting_not_failed(scrape, tenant):
    """A replay leaves the stages it reset or queued ``failed`` in the ledger (so they are
    claimable), with the replay as their reason: /metrics counts them under their own
    status, so the alert on failed stages stays quiet. The ledger's own family keeps the
    ledger's status."""
    one, two = inquiry(tenant, "one"), inquiry(tenant, "two")
    stage_run(one, "extract", "failed", seconds=1, error="boom")
    stage_run(two, "extract", "failed", seconds=1, error="replay requested by admin:root at …")
    stage_run(two, "calculate", "failed", error="replay requested by admin:root at …")

    run_sweep("metrics_snapshot")
    found = scrape()

    assert value(found, "pgstage_pipeline_runs", stage="extract", status="failed") == 1
    assert value(found, "pgstage_pipeline_runs", stage="extract", status="waiting") == 1
    assert value(found, "pgstage_pipeline_runs", stage="calculate", status="waiting") == 1
    assert (
        "pgstage_pipeline_runs",
        frozenset({"stage": "calculate", "status": "failed"}.items()),
    ) not in found
    # A waiting stage has not run since the replay: it has no duration.
    duration = "pgstage_pipeline_stage_duration_seconds_count"
    assert value(found, duration, stage="extract", status="failed") == 1
    assert (duration, frozenset({"stage": "extract", "status": "waiting"}.items())) not in found
    assert (
        value(found, "pgstage_ledger_entries", ledger="pipeline.pipelinerun", status="failed") == 3
    )


def documented_metrics() -> dict[str, tuple[str, frozenset[str]]]:
    """docs/operations.md's metrics table: name → (type, label names)."""
    page = (ROOT / "docs" / "operations.md").read_text()
    table = page.split("| metric | type | labels | meaning |", 1)[1].split("\n\n", 1)[0]
    documented = {}
    for row in table.strip().splitlines()[1:]:
        name, kind, labels = (cell.strip() for cell in row.strip("|").split("|")[:3])
        labels = re.sub(r"\([^)]*\)", "", labels)
        documented[name.strip("`")] = (kind.split()[0], frozenset(re.findall(r"`(\w+)`", labels)))
    return documented


def test_the_metrics_table_lists_exactly_what_the_collectors_export(client, scrape, tenant):
    """Names, types and labels: the database families as their sources declare them, the
    web processes' own as a scrape shows them once each has a sample."""
    from tests.factories import UserFactory, auth_header

    client.post(
        "/api/analysis-jobs",
        {"title": 1},
        content_type="application/json",
        headers=auth_header(UserFactory(tenant=tenant)),
    )
    exported = {}
    for source in sources():
        for name, family in source.families().items():
            shown = f"{name}_total" if family.kind == "counter" else name
            exported[shown] = (family.kind, frozenset(family.labels))
    scrape()
    response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    for family in text_string_to_metric_families(response.content.decode()):
        if family.name.endswith("_created"):
            continue  # a counter's creation time, exported by a single process only
        shown = f"{family.name}_total" if family.type == "counter" else family.name
        labels = {key for s in family.samples for key in s.labels} - {"le", "quantile"}
        exported.setdefault(shown, (family.type, frozenset(labels)))
    assert "pgstage_admission_rejections_total" in exported
    assert "pgstage_http_request_duration_seconds" in exported
    assert documented_metrics() == exported
