"""The framework's /metrics families and its extension point, on real PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from prometheus_client.parser import text_string_to_metric_families

from queueing.ledger import Ledger
from queueing.metrics import Family, MetricSource, snapshot_take
from tests.queueing.models import Step

pytestmark = pytest.mark.django_db

TOKEN = "framework-metrics-token"
STEPS = Ledger(model=Step, key_fields=("unit", "stage"))


class TenRows(MetricSource):
    """A project's source: one live gauge, one counter from the history."""

    calls: list[str] = []

    def families(self) -> dict[str, Family]:
        return {
            "project_live": Family("gauge", "A live number.", ()),
            "project_done": Family("counter", "A history count.", ("kind",)),
        }

    def collect_live(self, families: dict[str, Family]) -> None:
        TenRows.calls.append("live")
        families["project_live"].samples[()] = 10

    def collect_history(self, families: dict[str, Family]) -> None:
        TenRows.calls.append("history")
        families["project_done"].samples[("a",)] = 3


class Clash(MetricSource):
    def families(self) -> dict[str, Family]:
        return {"pgstage_jobs": Family("gauge", "Declared twice.", ())}


@pytest.fixture
def scrape(client, settings):
    settings.METRICS_TOKEN = TOKEN

    def get() -> dict:
        response = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 200, response.content
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples
        }

    return get


def test_workers_ledger_entries_and_inline_sweeps(scrape):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers")
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) VALUES (now()), (now()),"
            " (now() - interval '1 hour')"
        )
        cursor.execute(
            "INSERT INTO pgstage_inline_sweeps (name, last_run, resumed_at)"
            " VALUES ('metrics-test', now() - interval '90 seconds', now())"
        )
    done = STEPS.claim(unit="u1", stage="a")
    STEPS.complete(done)
    STEPS.claim(unit="u1", stage="b")  # left running
    failed = STEPS.claim(unit="u2", stage="a")
    STEPS.fail(failed, error="boom")
    snapshot_take()
    found = scrape()
    assert found[("pgstage_workers", frozenset({"state": "alive"}.items()))] == 2
    assert found[("pgstage_workers", frozenset({"state": "silent"}.items()))] == 1
    ledger = "queueing.step"
    for status, count in (("running", 1), ("success", 1), ("failed", 1)):
        labels = frozenset({"ledger": ledger, "status": status}.items())
        assert found[("pgstage_ledger_entries", labels)] == count
    age = found[("pgstage_inline_sweep_age_seconds", frozenset({"sweep": "metrics-test"}.items()))]
    assert 90 <= age < 3600


def test_a_projects_source_is_collected_beside_the_framework(scrape, settings):
    settings.QUEUEING_METRICS_SOURCES = [f"{__name__}.TenRows"]
    TenRows.calls.clear()
    found = scrape()
    assert found[("project_live", frozenset())] == 10
    # Its history is read from the snapshot: not taken yet, no series but the zero ones.
    assert ("project_done_total", frozenset({"kind": "a"}.items())) not in found
    assert TenRows.calls == ["live"]
    snapshot_take()
    found = scrape()
    assert found[("project_done_total", frozenset({"kind": "a"}.items()))] == 3
    assert found[("pgstage_metrics_snapshot_age_seconds", frozenset())] >= 0


def test_two_sources_may_not_declare_one_family(settings):
    settings.QUEUEING_METRICS_SOURCES = [f"{__name__}.Clash"]
    with pytest.raises(ValueError, match="pgstage_jobs"):
        snapshot_take()


def test_head_and_process_metrics_count_requests(client, scrape):
    client.head("/healthz")
    client.head("/healthz")
    found = scrape()
    labels = frozenset({"method": "HEAD", "status": "200"}.items())
    before = found[("pgstage_http_request_duration_seconds_count", labels)]
    client.head("/healthz")
    assert scrape()[("pgstage_http_request_duration_seconds_count", labels)] == before + 1
