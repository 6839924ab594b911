"""The runs app's migrations, against the faults a deploy meets: a ``CREATE INDEX
CONCURRENTLY`` that failed part-way (a deadlock, a statement or lock timeout, the deploy
cancelled) leaves an invalid index of its name; the next ``migrate`` builds it again."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

INDEX = "core_runs_unfinished_idx"


def _index_valid() -> bool | None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s",
            [INDEX],
        )
        row = cursor.fetchone()
    return None if row is None else row[0]


@pytest.mark.django_db(transaction=True)
def test_an_unfinished_runs_index_left_invalid_by_a_failed_build_is_built_again():
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0007_core_run_cancelled")])
    try:
        assert _index_valid() is None
        with connection.cursor() as cursor:
            # What a failed CREATE INDEX CONCURRENTLY leaves behind.
            cursor.execute(
                f"CREATE INDEX {INDEX} ON core_runs (id)"
                " WHERE state IN ('held', 'released', 'judging')"
            )
            cursor.execute(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
                [INDEX],
            )
        assert _index_valid() is False
        executor.loader.build_graph()
        executor.migrate([("runs", "0008_core_runs_unfinished_idx")])
        assert _index_valid() is True
        executor.loader.build_graph()
        executor.migrate([("runs", "0007_core_run_cancelled")])
        assert _index_valid() is None
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP INDEX IF EXISTS {INDEX}")
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_the_backed_out_balance_table_is_dropped_where_a_development_build_made_it():
    """A database that ran a development build's ``0009_credit_balances`` keeps its
    table, triggers and functions, which lock a balance row on every ledger write;
    ``0009_drop_credit_balances`` removes them (and does nothing elsewhere)."""
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0008_core_runs_unfinished_idx")])
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE credit_balances (user_id integer PRIMARY KEY, balance bigint);"
                "CREATE FUNCTION credit_balances_follow() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN RETURN NULL; END $$;"
                "CREATE FUNCTION credit_balances_empty() RETURNS trigger LANGUAGE plpgsql"
                " AS $$ BEGIN RETURN NULL; END $$;"
                "CREATE TRIGGER credit_balances_follow AFTER INSERT ON credit_ledger"
                " FOR EACH ROW EXECUTE FUNCTION credit_balances_follow();"
                "CREATE TRIGGER credit_balances_empty AFTER TRUNCATE ON credit_ledger"
                " FOR EACH STATEMENT EXECUTE FUNCTION credit_balances_empty();"
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM pg_class WHERE relname = 'credit_balances'),"
            " (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'credit_balances%%'),"
            " (SELECT count(*) FROM pg_proc WHERE proname LIKE 'credit_balances%%')"
        )
        assert cursor.fetchone() == (0, 0, 0)
