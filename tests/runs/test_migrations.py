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
