from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from runs import admission, credits, durability, processing
from runs.models import AnalysisJob, JobStatus
from tests.factories import auth_header
from tests.runs.factories import SOURCES, funded_user


@pytest.fixture(autouse=True)
def _fold_every_settled_entry(monkeypatch) -> None:
    """Each admission folds the user's settled ledger entries into their balance mark
    (``runs.credits.FOLD_AFTER`` 1, not 100) whenever one is there (a transaction with
    writes still open on the server, a parallel test worker's, holds the horizon back),
    and invariant 5d checks the balance it leaves."""
    monkeypatch.setattr(credits, "FOLD_AFTER", 1)


COUNTED_TABLES = (
    "analysis_jobs",
    "core_runs",
    "credit_ledger",
    "analysis_runs",
    "job_citations",
    "procrastinate_jobs",
)


@pytest.fixture
def api():
    """``api(user).post(path, json)`` / ``.get(path)`` with the user's bearer token."""

    class Api:
        def __init__(self, user):
            self.client = Client()
            self.headers = auth_header(user) if user is not None else {}

        def post(self, path, body, **kwargs):
            return self.client.post(
                path, body, content_type="application/json", headers=self.headers, **kwargs
            )

        def get(self, path, **kwargs):
            return self.client.get(path, headers=self.headers, **kwargs)

    return Api


@pytest.fixture
def table_counts():
    """A snapshot of the row counts (and today's core budget use) that a refused request
    must leave unchanged."""

    def snapshot() -> dict[str, int]:
        counts = {}
        with connection.cursor() as cursor:
            for table in COUNTED_TABLES:
                cursor.execute(f"SELECT count(*) FROM {table}")
                counts[table] = cursor.fetchone()[0]
            cursor.execute("SELECT coalesce(sum(used), 0) FROM core_daily_usage")
            counts["core_budget_used"] = cursor.fetchone()[0]
        return counts

    return snapshot


@dataclass(frozen=True, kw_only=True)
class FailedDeltas:
    user: Any
    saved: int
    superseded: int
    latest: int
    run_id: uuid.UUID


@pytest.fixture
def failed_deltas(db) -> FailedDeltas:
    """An analysis the client saved (``saved``) and two delta re-checks of it that failed
    (``superseded``, then ``latest``): a retry of the first is refused, since the second
    supersedes it; one of the second would replace ``saved``'s job in its run."""
    user = funded_user(credits=10)
    doc = "<p>Water boils at one hundred degrees [thermo].</p>"
    saved = admission.analysis_job_admit(user=user, title="v1", doc_html=doc, sources=SOURCES).id
    processing.analysis_job_process(job_id=saved)
    durability.analysis_run_save(user=user, job_id=saved)
    superseded, latest = (
        admission.analysis_job_admit(
            user=user, title=title, doc_html=doc, sources=SOURCES, delta_of_job_id=saved
        ).id
        for title in ("v2", "v3")
    )
    AnalysisJob.objects.filter(pk__in=[superseded, latest]).update(status=JobStatus.FAILED)
    run_id = AnalysisJob.objects.get(pk=saved).run_id
    return FailedDeltas(user=user, saved=saved, superseded=superseded, latest=latest, run_id=run_id)
