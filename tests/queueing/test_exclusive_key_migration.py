"""queueing 0014 rebuilds the EXCLUSIVE key's partial unique index (``LIKE 'exclusive/%'``)
while the web and workers enqueue: the key stays unique at every moment, a run stopped at
any step and run again ends with the one valid index, and it goes back."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

INDEX = "pgstage_jobs_exclusive_key"
NEW = f"{INDEX}_new"
BEFORE = ("queueing", "0013_job_deadline_owned_run")
AFTER = ("queueing", "0014_exclusive_key_predicate")
KEYS = [f"exclusive/k:{i}" for i in range(20)]


def _indexes() -> dict[str, tuple[bool, str]]:
    """The unique indexes on procrastinate_jobs(queueing_lock) with LIKE in their predicate."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, i.indisvalid, pg_get_expr(i.indpred, i.indrelid)"
            "  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
            " WHERE i.indrelid = 'procrastinate_jobs'::regclass AND i.indisunique"
            "   AND pg_get_expr(i.indpred, i.indrelid) LIKE '%%~~%%'"
        )
        return {name: (valid, pred) for name, valid, pred in cursor.fetchall()}


def _duplicates() -> list[tuple[str, int]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT queueing_lock, count(*) FROM procrastinate_jobs"
            " WHERE status IN ('todo', 'doing') AND queueing_lock LIKE 'exclusive/%%'"
            " GROUP BY 1 HAVING count(*) > 1"
        )
        return cursor.fetchall()


def _insert_sql(status: str) -> str:
    return (
        "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args, queueing_lock)"
        f" VALUES ('q', 't', '{status}', '{{}}', %s) ON CONFLICT DO NOTHING"
    )


@pytest.fixture
def executor(clean_queue):
    executor = MigrationExecutor(connection)
    executor.migrate([BEFORE])
    executor.loader.build_graph()
    yield executor
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX IF EXISTS {NEW}")
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())


def _migrate(executor: MigrationExecutor, target: tuple[str, str]) -> None:
    executor.loader.build_graph()
    executor.migrate([target])


@pytest.mark.django_db(transaction=True)
def test_the_key_stays_unique_while_the_index_is_rebuilt_under_concurrent_enqueues(executor):
    with connection.cursor() as cursor:
        for i, key in enumerate(KEYS):
            cursor.execute(_insert_sql("doing" if i % 2 else "todo"), [key])
    stop = threading.Event()
    errors: list[BaseException] = []
    dsn = connection.get_connection_params()

    def enqueue() -> None:
        try:
            with psycopg.connect(**dsn, autocommit=True) as conn:
                while not stop.is_set():
                    for key in KEYS:
                        conn.execute(_insert_sql("todo"), [key])
                        # A job that finishes frees its key; the next enqueue takes it.
                        conn.execute(
                            "UPDATE procrastinate_jobs SET status = 'succeeded'"
                            " WHERE id = (SELECT max(id) FROM procrastinate_jobs"
                            "              WHERE queueing_lock = %s AND status = 'todo')",
                            [key],
                        )
                        conn.execute(_insert_sql("todo"), [key])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=enqueue) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        _migrate(executor, AFTER)
        assert _duplicates() == []
        _migrate(executor, BEFORE)
        assert _duplicates() == []
        _migrate(executor, AFTER)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert _duplicates() == []
    ((name, (valid, predicate)),) = _indexes().items()
    assert (name, valid) == (INDEX, True)
    assert "'exclusive/%'::text" in predicate, predicate


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step", ["new-invalid", "new-built", "old-dropped", "renamed"])
def test_a_run_stopped_at_any_step_ends_with_the_one_valid_index(executor, step):
    with connection.cursor() as cursor:
        for key in KEYS:
            cursor.execute(_insert_sql("todo"), [key])
        create = (
            f"CREATE UNIQUE INDEX {NEW} ON procrastinate_jobs (queueing_lock)"
            " WHERE status IN ('todo', 'doing') AND queueing_lock LIKE 'exclusive/%'"
        )
        cursor.execute(create)
        if step == "new-invalid":
            cursor.execute(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = %s::regclass", [NEW]
            )
        if step in {"old-dropped", "renamed"}:
            cursor.execute(f"DROP INDEX {INDEX}")
        if step == "renamed":
            cursor.execute(f"ALTER INDEX {NEW} RENAME TO {INDEX}")
    _migrate(executor, AFTER)
    ((name, (valid, predicate)),) = _indexes().items()
    assert (name, valid) == (INDEX, True)
    assert "'exclusive/%'::text" in predicate, predicate
    with connection.cursor() as cursor:
        cursor.execute(_insert_sql("doing"), [KEYS[0]])
    assert _duplicates() == []
    _migrate(executor, BEFORE)
    ((name, (valid, predicate)),) = _indexes().items()
    assert (name, valid) == (INDEX, True)
    assert "'exclusive/%%'::text" in predicate, predicate
