from __future__ import annotations

import psycopg
import pytest
from django.db import transaction

from queueing import locks
from queueing.exceptions import DuplicateNamespace, LockOutsideTransaction, UnknownNamespace
from tests.conftest import database_url

TEST_NS = locks.namespace("test_locks")


def other_connection_try(namespace: str, key: str) -> bool:
    """Ask from a second, independent connection whether the lock is free (and release)."""
    with psycopg.connect(database_url(), autocommit=False) as conn:
        got = conn.execute(
            "SELECT pg_try_advisory_xact_lock(hashtextextended(%s || ':' || %s, 0))",
            [namespace, key],
        ).fetchone()[0]
        conn.rollback()
        return got


@pytest.mark.django_db(transaction=True)
def test_held_lock_blocks_the_same_key_only():
    with transaction.atomic():
        locks.xact_lock(TEST_NS, "user-1")
        assert other_connection_try("test_locks", "user-1") is False
        assert other_connection_try("test_locks", "user-2") is True
        assert other_connection_try("other_ns", "user-1") is True
    # Released at commit.
    assert other_connection_try("test_locks", "user-1") is True


@pytest.mark.django_db(transaction=True)
def test_try_lock_reports_a_lock_held_elsewhere():
    with psycopg.connect(database_url()) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('test_locks:k', 0))")
        with transaction.atomic():
            assert locks.try_xact_lock(TEST_NS, "k") is False
            assert locks.try_xact_lock(TEST_NS, "k2") is True


@pytest.mark.django_db(transaction=True)
def test_refuses_to_lock_outside_a_transaction():
    with pytest.raises(LockOutsideTransaction, match="autocommit"):
        locks.xact_lock(TEST_NS, "k")


def test_namespaces_are_declared_once():
    with pytest.raises(DuplicateNamespace):
        locks.namespace("test_locks")


@pytest.mark.django_db
def test_undeclared_namespace_is_refused():
    with transaction.atomic(), pytest.raises(UnknownNamespace):
        locks.xact_lock(locks.Namespace("typo-namespace"), "k")


def test_only_the_locks_module_issues_advisory_lock_sql():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in root.glob("*/**/*"):
        if path.suffix not in {".py", ".sql"} or ".venv" in path.parts or "tests" in path.parts:
            continue
        if "pg_advisory" in path.read_text(errors="ignore") and path.name not in {
            "locks.py",
            "queueing.sql",
        }:
            offenders.append(str(path.relative_to(root)))
    assert offenders == []
