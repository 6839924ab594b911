"""The queueing app's migrations, against the faults a deploy meets.

Fault model — what can fail while a migration runs, and the test that covers it:

- ``CREATE INDEX CONCURRENTLY`` on a busy table fails part-way (a deadlock, a statement
  or lock timeout, the deploy cancelled): it leaves an invalid index of its name, which
  the planner never uses; the next ``migrate`` must build it again, not skip it:
  test_a_todo_index_left_invalid_by_a_failed_build_is_built_again.
"""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

INDEX = "pgstage_jobs_todo_by_task_idx"


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
def test_a_todo_index_left_invalid_by_a_failed_build_is_built_again(clean_queue):
    executor = MigrationExecutor(connection)
    executor.migrate([("queueing", "0009_job_deadlines")])
    try:
        assert _index_valid() is None
        with connection.cursor() as cursor:
            # What a failed CREATE INDEX CONCURRENTLY leaves behind.
            cursor.execute(
                f"CREATE INDEX {INDEX} ON procrastinate_jobs (task_name, queue_name, "
                "priority DESC, id) WHERE status = 'todo'"
            )
            cursor.execute(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass",
                [INDEX],
            )
        assert _index_valid() is False
        executor.loader.build_graph()
        executor.migrate([("queueing", "0010_todo_jobs_by_task_and_worker_queues_and_hooks")])
        assert _index_valid() is True
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
