"""The worker's fetch runs on a generic plan that its server session keeps (the function
``pgstage_fetch_job_v1``, ``queueing.planner``): the plan must fit whatever the table
holds later, not the statistics it was made under. Real PostgreSQL, the worker's own
pool.

Fault model:
- a worker starts on a quiet queue (the table empty, or three jobs, analysed) and a
  burst follows: test_a_generic_fetch_planned_on_a_quiet_table_walks_past_a_later_burst
  (before the fix its kept plan read the whole table on every fetch — 20,005 rows at
  20,000 waiting jobs; 300,009 rows and 72 ms a fetch at 100,000 + 100,000, against 10
  rows and 0.5 ms planned afresh — until VACUUM or ANALYZE replaced it);
- statistics of a vacuumed quiet spell, and a burst of 20,000 + 20,000:
  test_the_locked_pick_reads_only_its_job_under_vacuumed_quiet_statistics (before the
  fix the pick of the chosen job went through a partial index of the waiting jobs,
  filtered by id: 20,012 rows, 100,012 at 100,000 + 100,000, on either plan);
- the server forgets the prepared fetch and the function's plan behind psycopg's back (a
  pooler's DISCARD ALL, a DEALLOCATE ALL):
  test_the_fetch_recovers_from_a_deallocate_all_behind_psycopgs_back;
- a walk fails (on the server, or a parameter psycopg cannot send):
  test_the_walk_settings_end_with_a_failed_walk.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from django.db import connection, transaction
from procrastinate.contrib.django.utils import connector_params

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.planner import FETCH_SETTINGS
from queueing.sql import array_literal, statement_cursor
from queueing.worker import fetch_beat_seconds, queries
from tests.plans import SESSION_ROWS_READ, fetch_statement, rows_read

pytestmark = pytest.mark.django_db(transaction=True)


def _ddl(statement: str, params: list | None = None) -> None:
    with psycopg.connect(**connector_params(), autocommit=True) as other:
        other.execute(statement, params)


def _burst(task_name: str, priority: int, n: int) -> None:
    _ddl(
        "INSERT INTO procrastinate_jobs (task_name, queue_name, priority, args, status)"
        " SELECT %s, CASE WHEN g %% 2 = 0 THEN 'runs' ELSE 'default' END, %s, '{}', 'todo'"
        " FROM generate_series(1, %s) AS g",
        [task_name, priority, n],
    )


def _cached_fetch_rows_read(conn: psycopg.AsyncConnection, worker_id: int) -> int:
    """Rows read by a fetch on ``conn`` on the plan its session keeps for the function
    (the server's counters of a transaction rolled back: the job it takes stays
    waiting)."""

    async def body() -> int:
        params = {
            "queues": None,
            "worker_id": worker_id,
            "task_names": array_literal(("tests.record",)),
            "timeout_tasks": array_literal(()),
            "timeout_seconds": array_literal(()),
            "unflushed": array_literal(()),
            "beat_seconds": fetch_beat_seconds(),
        }
        async with conn.transaction(force_rollback=True):
            before = await (await conn.execute(SESSION_ROWS_READ)).fetchone()
            fetched = await (await conn.execute(queries["fetch_job"], params)).fetchone()
            after = await (await conn.execute(SESSION_ROWS_READ)).fetchone()
        assert fetched[0] is not None
        return int(after[0] - before[0])

    return body


@pytest.mark.parametrize("quiet", ["empty", "three jobs"])
def test_a_generic_fetch_planned_on_a_quiet_table_walks_past_a_later_burst(clean_queue, quiet):
    """A worker starts on a quiet queue; its pooled connection's first fetch plans the
    generic plan on statistics that say (nearly) no job. A burst of 20,000 waiting jobs
    of its own task follows; until autovacuum next looks at the table, each fetch on that
    connection should still read a handful of rows, as a custom plan does (6)."""
    from procrastinate.contrib.django import app

    from queueing.connector import worker_connector
    from queueing.worker import TaskNameJobManager

    if quiet == "three jobs":
        _burst("tests.record", 0, 3)
    _ddl("ANALYZE procrastinate_jobs")

    async def body() -> tuple[int, int]:
        connector = worker_connector(min_size=1, max_size=1)
        await connector.open_async()
        try:
            manager = TaskNameJobManager(
                connector=connector, tasks=lambda: {"tests.record": app.tasks["tests.record"]}
            )
            worker_id = await manager.register_worker()
            await manager.fetch_job(queues=None, worker_id=worker_id)  # plans it
            await asyncio.to_thread(_burst, "tests.record", 0, 20000)
            job = await manager.fetch_job(queues=None, worker_id=worker_id)
            assert job is not None
            async with connector.pool.connection() as conn:
                return await _cached_fetch_rows_read(conn, worker_id)(), worker_id
        finally:
            await connector.close_async()

    read, _ = asyncio.run(body())
    assert read < 50


def test_the_locked_pick_reads_only_its_job_under_vacuumed_quiet_statistics(clean_queue):
    """tests/queueing/test_fetch.py's "vacuumed quiet" state with a burst of 20,000 jobs
    of another task and 20,000 of the worker's own (its test has 5,000 of each)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (task_name, queue_name, args, status)"
            " SELECT 'tests.record', 'default', '{}', 'succeeded'"
            " FROM generate_series(1, 20000)"
        )
        cursor.execute("ANALYZE procrastinate_jobs")
        cursor.execute("DELETE FROM procrastinate_jobs WHERE id % 250 <> 0")
        cursor.execute("VACUUM procrastinate_jobs")
    _burst("gone.task", 9, 20000)
    _burst("tests.record", 0, 20000)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker_id,) = cursor.fetchone()
    fetch = {
        "queues": None,
        "worker_id": worker_id,
        "task_names": ["tests.record"],
        "timeout_tasks": [],
        "timeout_seconds": [],
        "unflushed": [],
    }
    generic = rows_read(fetch_statement(), fetch, settings=FETCH_SETTINGS, generic=True)
    custom = rows_read(fetch_statement(), fetch, settings=FETCH_SETTINGS)
    assert generic < 50 and custom < 50, (generic, custom)


def test_the_fetch_recovers_from_a_deallocate_all_behind_psycopgs_back(clean_queue):
    """A pooler's DISCARD ALL / DEALLOCATE ALL that psycopg never sees: the prepared
    fetch's name is gone on the server (and DISCARD ALL drops the function's plan too);
    the next fetch replans once and takes its job, and the statement is prepared again
    once it has run as often as a new one."""
    from procrastinate.contrib.django import app

    from queueing.connector import PREPARE_THRESHOLD, worker_connector
    from queueing.enqueue import enqueue
    from queueing.worker import TaskNameJobManager

    runs = PREPARE_THRESHOLD + 1
    for n in range(2 * runs + 2):
        enqueue("tests.record", args={"label": f"job {n}"})
    prepared = (
        "SELECT count(*) AS n FROM pg_prepared_statements"
        " WHERE statement LIKE '%%pgstage_fetch_job_v1(%%'"
        " AND statement NOT LIKE '%%pg_prepared_statements%%'"
    )

    async def body() -> tuple[list, list]:
        connector = worker_connector(min_size=1, max_size=1)
        await connector.open_async()
        try:
            manager = TaskNameJobManager(connector=connector, tasks=lambda: app.tasks)
            worker_id = await manager.register_worker()
            taken = [
                (await manager.fetch_job(queues=None, worker_id=worker_id)).id for _ in range(runs)
            ]
            counts = [(await connector.execute_query_one_async(prepared))["n"]]
            for behind_its_back in (b"DEALLOCATE ALL", b"DISCARD ALL"):
                async with connector.pool.connection() as conn:
                    assert (
                        conn.pgconn.exec_(behind_its_back).status
                        == psycopg.pq.ExecStatus.COMMAND_OK
                    )
                job = await manager.fetch_job(queues=None, worker_id=worker_id)
                taken.append(job.id)
            for _ in range(runs):
                taken.append((await manager.fetch_job(queues=None, worker_id=worker_id)).id)
            counts.append((await connector.execute_query_one_async(prepared))["n"])
            return taken, counts
        finally:
            await connector.close_async()

    taken, counts = asyncio.run(body())
    assert len(set(taken)) == 2 * runs + 2
    assert counts == [1, 1]


def test_after_a_rollback_each_statement_runs_again_in_one_round_trip():
    """psycopg forgets every prepared statement on a rollback (a request's atomic block
    that raised); the statement cursor knows, and prepares the statement's next run in a
    pipeline with its execution: one round trip, not two."""
    from bench.scenarios.common import through
    from bench.wire import WireCounter
    from tests.queueing.test_round_trips import _params

    def run() -> None:
        with statement_cursor(connection) as cursor:
            cursor.execute("SELECT 1 AS one /* pgstage rollback probe */ WHERE %s", [True])
            cursor.fetchall()

    with WireCounter(_params()) as counter:

        def counted() -> tuple[bool, int]:
            run()
            prepares = connection.connection.prepare_threshold is not None
            run()
            with pytest.raises(ZeroDivisionError), transaction.atomic():
                run()
                1 / 0  # noqa: B018
            before = counter.snapshot()
            run()
            return prepares, (counter.snapshot() - before).round_trips

        prepares, again = through(counter, counted)
    assert prepares
    assert again == 1


def test_the_walk_settings_end_with_a_failed_walk(clean_queue):
    """A walk that fails on the server (division by zero) or on the client (a parameter
    psycopg cannot adapt) leaves the pooled connection with PostgreSQL's own
    plan_cache_mode, enable_sort and jit."""
    from procrastinate import exceptions as procrastinate_exceptions

    from queueing.connector import worker_connector
    from queueing.planner import rows_walking_async

    async def body() -> list:
        connector = worker_connector(min_size=1, max_size=1)
        await connector.open_async()
        try:
            seen = []
            for query, arguments in (
                ("SELECT 1 / %(x)s::int AS x", {"x": 0}),
                ("SELECT %(x)s AS x", {"x": object()}),
            ):
                with pytest.raises(
                    (procrastinate_exceptions.ConnectorException, TypeError, psycopg.Error)
                ):
                    await rows_walking_async(connector, query, **arguments)
                seen.append(
                    await connector.execute_query_one_async(
                        "SELECT current_setting('plan_cache_mode') AS mode,"
                        " current_setting('enable_sort') AS sort, current_setting('jit') AS jit"
                    )
                )
            return seen
        finally:
            await connector.close_async()

    assert asyncio.run(body()) == [{"mode": "auto", "sort": "on", "jit": "on"}] * 2
