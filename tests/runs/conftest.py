from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client

from tests.factories import auth_header

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
