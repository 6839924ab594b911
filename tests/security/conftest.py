"""Fixtures of the hostile-input suite: a funded user with a token in one tenant, a
second tenant, and the footprint (rows of every table a request or command could write,
today's core budget use, files under the storage root) that a refusal must leave as it
found it."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from accounts.services import api_token_create
from runs.credits import credit_grant
from tests.factories import TenantFactory, UserFactory

#: Every table a request or command of pgstage writes (procrastinate's job table
#: included: an enqueue is a write).
WRITTEN_TABLES = (
    "tenants",
    "users",
    "api_tokens",
    "anfragen",
    "pipeline_runs",
    "anfrage_files",
    "anfrage_positions",
    "anfrage_warnings",
    "audit_log",
    "analysis_jobs",
    "analysis_runs",
    "job_citations",
    "core_runs",
    "credit_ledger",
    "procrastinate_jobs",
)


@pytest.fixture(autouse=True)
def storage_root(settings, tmp_path) -> Path:
    root = tmp_path / "storage"
    settings.STORAGE_ROOT = root
    return root


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="acme")


@pytest.fixture
def user(tenant):
    user = UserFactory(username="alice", tenant=tenant)
    credit_grant(user_id=user.pk, amount=100, note="test")
    return user


@pytest.fixture
def token(user) -> str:
    return api_token_create(user=user)


@pytest.fixture
def footprint(storage_root):
    """``footprint()``: row counts of every written table, the core budget used and
    the files under the storage root, to compare before and after a refusal."""

    def snapshot() -> dict[str, object]:
        counts: dict[str, object] = {}
        with connection.cursor() as cursor:
            for table in WRITTEN_TABLES:
                cursor.execute(f"SELECT count(*) FROM {table}")
                counts[table] = cursor.fetchone()[0]
            cursor.execute("SELECT coalesce(sum(used), 0) FROM core_daily_usage")
            counts["core_budget_used"] = cursor.fetchone()[0]
            cursor.execute("SELECT count(*) FROM api_tokens WHERE revoked_at IS NOT NULL")
            counts["revoked_tokens"] = cursor.fetchone()[0]
        counts["files"] = sorted(
            str(p.relative_to(storage_root)) for p in storage_root.rglob("*") if p.is_file()
        )
        return counts

    return snapshot
