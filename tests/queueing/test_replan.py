"""A prepared statement outlives a migration that changes what it returns.

PostgreSQL refuses to run a prepared statement whose result columns changed since it was
prepared ("cached plan must not change result type"): a rolling deploy's migration that
widens a column (``integer`` to ``bigint``) does that to every connection of the old
release that prepared a statement returning it. Each connection must prepare again, or
the statement fails for the connection's whole life. Real sessions, real ``ALTER``s.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from django.db import NotSupportedError, connection, transaction
from procrastinate.contrib.django.utils import connector_params

from queueing.sql import plan_went_stale, statement_cursor

PROBE = "SELECT id, width FROM replan_probe ORDER BY id"


def _ddl(statement: str) -> None:
    """``statement`` from a session of its own, committed (a deploy's migration)."""
    with psycopg.connect(**connector_params(), autocommit=True) as other:
        other.execute(statement)


@pytest.fixture
def probe(transactional_db):
    _ddl("DROP TABLE IF EXISTS replan_probe")
    _ddl("CREATE TABLE replan_probe (id integer PRIMARY KEY, width integer NOT NULL)")
    _ddl("INSERT INTO replan_probe VALUES (1, 10), (2, 20)")
    yield
    _ddl("DROP TABLE IF EXISTS replan_probe")


def _widen() -> None:
    _ddl("ALTER TABLE replan_probe ALTER COLUMN width TYPE bigint")


def test_the_refusal_is_what_the_server_says_about_a_stale_plan(probe):
    """The premise, on a plain psycopg connection that prepares: after another session
    widens a returned column, the prepared statement is refused, again and again."""
    params = {**connector_params(), "prepare_threshold": 0}
    with psycopg.connect(**params, autocommit=True) as raw:
        raw.execute(PROBE).fetchall()
        _widen()
        for _ in range(2):
            with pytest.raises(psycopg.errors.FeatureNotSupported) as refused:
                raw.execute(PROBE)
            assert plan_went_stale(refused.value)


def test_a_prepared_statement_outside_a_transaction_runs_on_a_new_plan(probe):
    """Django's connection in autocommit: the framework's statement cursor runs the
    refused statement again once the connection forgot its prepared statements; it
    returns the widened rows, and stays prepared."""
    for _ in range(2):
        with statement_cursor(connection) as cursor:
            cursor.execute(PROBE)
            assert cursor.fetchall() == [(1, 10), (2, 20)]
    _widen()
    _ddl("UPDATE replan_probe SET width = 3000000000 WHERE id = 2")
    with statement_cursor(connection) as cursor:
        cursor.execute(PROBE)
        assert cursor.fetchall() == [(1, 10), (2, 3000000000)]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s", [PROBE])
        assert cursor.fetchone() == (1,)


def test_inside_a_transaction_the_refusal_fails_it_once_and_the_next_one_runs(probe):
    """A transaction cannot run the statement again (the refusal aborted it); its
    rollback makes the connection forget its prepared statements, so only that one
    transaction fails."""
    with transaction.atomic(), statement_cursor(connection) as cursor:
        cursor.execute(PROBE)
    _widen()
    with (
        pytest.raises(NotSupportedError),
        transaction.atomic(),
        statement_cursor(connection) as cursor,
    ):
        cursor.execute(PROBE)
    with transaction.atomic(), statement_cursor(connection) as cursor:
        cursor.execute(PROBE)
        assert cursor.fetchall() == [(1, 10), (2, 20)]


def test_the_workers_pool_runs_a_refused_statement_on_a_new_plan(probe):
    """The worker's pooled connection (autocommit, preparing from a statement's fifth
    run): after the widening the statement runs again on the same connection, at once,
    instead of failing until the pool replaces the connection."""
    from queueing.connector import worker_connector

    async def body() -> tuple[list, list, set[int]]:
        connector = worker_connector(min_size=1, max_size=1)
        await connector.open_async()
        try:
            pids = set()
            for _ in range(6):
                before = await connector.execute_query_all_async(PROBE)
                pids.add(
                    (await connector.execute_query_one_async("SELECT pg_backend_pid() AS p"))["p"]
                )
            await asyncio.to_thread(_widen)
            after = await connector.execute_query_all_async(PROBE)
            pids.add((await connector.execute_query_one_async("SELECT pg_backend_pid() AS p"))["p"])
            return before, after, pids
        finally:
            await connector.close_async()

    before, after, pids = asyncio.run(body())
    assert before == after == [{"id": 1, "width": 10}, {"id": 2, "width": 20}]
    assert len(pids) == 1


def test_the_workers_fetch_survives_a_migration_that_widens_a_column_it_returns(clean_queue):
    """procrastinate's fetch, prepared on the worker's pooled connection, after another
    session widens ``procrastinate_jobs.attempts`` (a column the fetch returns): the next
    fetch takes the next job. Without the replan every later fetch on that connection
    failed, so the worker took no job until the pool replaced the connection."""
    from procrastinate.contrib.django import app

    import tests.queueing.tasks  # noqa: F401  (registers the test tasks)
    from queueing.connector import worker_connector
    from queueing.worker import TaskNameJobManager

    async def body() -> list[int | None]:
        connector = worker_connector(min_size=1, max_size=1)
        await connector.open_async()
        try:
            manager = TaskNameJobManager(connector=connector, tasks=lambda: app.tasks)
            worker_id = await manager.register_worker()
            taken = []
            for _ in range(6):
                job = await manager.fetch_job(queues=None, worker_id=worker_id)
                taken.append(job and job.id)
            await asyncio.to_thread(
                _ddl, "ALTER TABLE procrastinate_jobs ALTER COLUMN attempts TYPE bigint"
            )
            job = await manager.fetch_job(queues=None, worker_id=worker_id)
            taken.append(job and job.id)
            return taken
        finally:
            await connector.close_async()

    from queueing.enqueue import enqueue

    for n in range(7):
        enqueue("tests.record", args={"label": f"job {n}"})
    try:
        taken = asyncio.run(body())
    finally:
        _ddl("ALTER TABLE procrastinate_jobs ALTER COLUMN attempts TYPE integer")
    assert None not in taken and len(set(taken)) == 7


class TestTheSerialAdmit:
    """The serial queue's admit outside a transaction (``BEGIN; lock; admit; COMMIT`` in
    one pipeline, the admit prepared) after another session widens a column it returns
    (``status`` varchar(20) to varchar(40), a Django ``max_length`` change): the refused
    block was rolled back whole and runs again, so no admit fails — also on a connection
    whose first admit had failed (psycopg honours a ROLLBACK *statement* once per
    connection; the admit now rolls back through psycopg, which always forgets)."""

    pytestmark = pytest.mark.django_db(transaction=True)

    @pytest.fixture(autouse=True)
    def narrow_again(self):
        yield
        _ddl("ALTER TABLE test_items ALTER COLUMN status TYPE varchar(20)")

    @staticmethod
    def _admits(n: int) -> list[str]:
        from django.db import DatabaseError

        from tests.queueing.test_serial import QUEUE

        outcomes = []
        for i in range(n):
            try:
                QUEUE.admit(key="replan", values={"label": f"admit {i}"})
                outcomes.append("ok")
            except DatabaseError as exc:
                outcomes.append(type(exc).__name__)
        return outcomes

    def test_no_admit_fails_after_the_widening(self):
        connection.close()
        assert self._admits(3) == ["ok"] * 3
        _ddl("ALTER TABLE test_items ALTER COLUMN status TYPE varchar(40)")
        assert self._admits(4) == ["ok"] * 4

    def test_nor_on_a_connection_whose_first_admit_failed(self):
        from django.db import DatabaseError

        from tests.queueing.test_serial import QUEUE

        connection.close()
        with pytest.raises(DatabaseError):
            QUEUE.admit(key="replan", values={"label": "y" * 60})  # too long: refused
        assert self._admits(3) == ["ok"] * 3
        _ddl("ALTER TABLE test_items ALTER COLUMN status TYPE varchar(40)")
        assert self._admits(6) == ["ok"] * 6


def test_a_prepared_statement_the_server_lost_runs_again(probe):
    """psycopg believes a statement prepared that the session no longer has (a
    ``DEALLOCATE ALL`` whose text psycopg had met before, or a pooler's ``DISCARD ALL``):
    26000 on its ``_pg3_`` name; the statement cursor forgets and runs it again."""
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # psycopg meets the text while nothing is prepared
    for _ in range(2):
        with statement_cursor(connection) as cursor:
            cursor.execute(PROBE)
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # counted, not honoured: psycopg keeps its name
    with statement_cursor(connection) as cursor:
        cursor.execute(PROBE)
        assert cursor.fetchall() == [(1, 10), (2, 20)]


def test_after_the_connection_forgot_its_prepared_statements_each_runs_in_one_round_trip(
    probe,
):
    """A statement's first run on a connection goes in a pipeline of its own (one round
    trip while psycopg prepares it). Once the connection forgot its prepared statements
    (``forget_prepared``: the planner's replan, or the cursor's), the next run is a first
    run again: before the fix it ran outside a pipeline and waited for the server to
    prepare it before sending the execution, a second round trip."""
    from bench.scenarios.common import through
    from bench.wire import WireCounter
    from queueing.sql import forget_prepared
    from tests.queueing.test_round_trips import _params

    def run() -> list:
        with statement_cursor(connection) as cursor:
            cursor.execute(PROBE)
            return cursor.fetchall()

    with WireCounter(_params()) as counter:

        def counted() -> tuple[list, int, int]:
            run()
            before = counter.snapshot()
            run()
            prepared = (counter.snapshot() - before).round_trips
            forget_prepared(connection.connection)
            before = counter.snapshot()
            rows = run()
            return rows, prepared, (counter.snapshot() - before).round_trips

        rows, prepared, again = through(counter, counted)
    assert rows == [(1, 10), (2, 20)]
    assert prepared == 1
    assert again == 1
