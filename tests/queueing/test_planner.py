"""The index walks' planner settings (``queueing.planner``): the statement runs under them,
in one round trip on the worker's pool, and they end with it, on success and on failure.

Fault model: a setting that outlived its statement would change the plans of whatever
ran next on that pooled or Django connection (sorts disabled for a report, JIT off for an
analytics query); one that did not reach the statement would leave the fetch on the plan
that read every waiting job (``tests/queueing/test_fetch.py``)."""

from __future__ import annotations

import asyncio

import django.db
import psycopg
import pytest
from django.db import connection, transaction
from procrastinate.exceptions import ConnectorException

from queueing.planner import rows_walking, rows_walking_async

SEEN = "SELECT current_setting('enable_sort') AS sort, current_setting('jit') AS jit"
FAILS = "SELECT 1 / %(zero)s AS never"


def _settings() -> tuple[str, str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('enable_sort'), current_setting('jit')")
        return cursor.fetchone()


@pytest.mark.django_db(transaction=True)
def test_on_the_workers_pool_in_one_round_trip_and_not_after_it():
    from queueing.connector import worker_connector
    from tests.queueing.test_round_trips import _on_the_wire

    async def body(connector, counter):
        await connector.open_async()
        try:
            before = counter.snapshot()
            inside = await rows_walking_async(connector, SEEN)
            spent = (counter.snapshot() - before).round_trips
            # procrastinate's wrapping, as for its own statements.
            with pytest.raises(ConnectorException) as failed:
                await rows_walking_async(connector, FAILS, zero=0)
            assert isinstance(failed.value.__cause__, psycopg.errors.DivisionByZero)
            # One pooled connection: whatever runs next on it.
            after = await connector.execute_query_one_async(SEEN)
            return inside, spent, after
        finally:
            await connector.close_async()

    inside, spent, after = _on_the_wire(lambda: worker_connector(min_size=1, max_size=1), body)
    assert inside == [{"sort": "off", "jit": "off"}]
    assert spent == 1
    assert after == {"sort": "on", "jit": "on"}


#: A walk with a parameter (a statement without one never gets a custom plan).
PLANNED = (
    "SELECT current_setting('plan_cache_mode') AS mode, "
    "current_setting('enable_seqscan') AS seqscan, %(x)s::int AS x /* pgstage planner probe */"
)
PLANS = (
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
    "WHERE statement LIKE '%%pgstage planner probe%%' AND statement NOT LIKE '%%pg_prepared%%'"
)


def _generic_walks(connector_args: dict, runs: int) -> tuple[list, list, dict]:
    """``runs`` generic walks of PLANNED on a one-connection worker pool: what the walk
    saw, its plans on that connection and the setting after it."""
    from queueing.connector import worker_connector
    from tests.queueing.test_round_trips import _on_the_wire

    async def body(connector, counter):
        await connector.open_async()
        try:
            seen = [
                await rows_walking_async(connector, PLANNED, generic=True, x=i) for i in range(runs)
            ]
            plans = await connector.execute_query_all_async(PLANS)
            after = await connector.execute_query_one_async(
                "SELECT current_setting('plan_cache_mode') AS mode, "
                "current_setting('enable_seqscan') AS seqscan"
            )
            return seen, plans, after
        finally:
            await connector.close_async()

    return _on_the_wire(lambda: worker_connector(**connector_args), body)


@pytest.mark.django_db(transaction=True)
def test_a_generic_walk_is_prepared_at_once_and_planned_once():
    """The worker's fetch (``generic=True``): prepared on its first run on a pooled
    connection and run on its generic plan every time after — not planned for each of
    the connection's first ten runs, nor for good when the custom plans looked cheaper."""
    seen, plans, after = _generic_walks({"min_size": 1, "max_size": 1}, runs=8)
    assert [rows[0]["mode"] for rows in seen] == ["force_generic_plan"] * 8
    # Its plan's shape does not depend on the statistics it was made under.
    assert [rows[0]["seqscan"] for rows in seen] == ["off"] * 8
    assert [rows[0]["x"] for rows in seen] == list(range(8))
    assert plans == [{"generic_plans": 8, "custom_plans": 0}]
    # The settings end with the walk's implicit transaction.
    assert after == {"mode": "auto", "seqscan": "on"}


@pytest.mark.django_db(transaction=True)
def test_a_generic_walk_is_not_prepared_where_the_connection_does_not_prepare(
    settings, monkeypatch
):
    """Behind a transaction pooler (``OPTIONS["prepare_threshold"] = None``) nothing is
    prepared on the server, the fetch included, and the fetch is planned for its own
    parameters."""
    monkeypatch.setitem(settings.DATABASES["default"]["OPTIONS"], "prepare_threshold", None)
    seen, plans, _ = _generic_walks({"min_size": 1, "max_size": 1}, runs=6)
    assert [rows[0]["x"] for rows in seen] == list(range(6))
    assert plans == []
    # Planned for each run, so on a plan that knows its parameters (a generic one would
    # be planned each time too, and know less).
    assert [rows[0]["mode"] for rows in seen] == ["auto"] * 6
    assert [rows[0]["seqscan"] for rows in seen] == ["off"] * 6


@pytest.mark.django_db(transaction=True)
def test_on_another_connector_through_djangos_connection():
    from procrastinate.contrib.django.django_connector import DjangoConnector

    assert asyncio.run(rows_walking_async(DjangoConnector(), SEEN)) == [
        {"sort": "off", "jit": "off"}
    ]


@pytest.mark.django_db(transaction=True)
def test_on_djangos_connection_outside_a_transaction_they_end_with_their_own():
    assert rows_walking(SEEN, {}) == [{"sort": "off", "jit": "off"}]
    assert _settings() == ("on", "on")
    # Django's error, as from any of its cursors (the pipeline reports it at its sync).
    with pytest.raises(django.db.DataError, match="division by zero"):
        rows_walking(FAILS, {"zero": 0})
    assert _settings() == ("on", "on")
    assert rows_walking(SEEN, {}) == [{"sort": "off", "jit": "off"}]


@pytest.mark.django_db(transaction=True)
def test_on_djangos_connection_outside_a_transaction_in_one_round_trip():
    from tests.queueing.test_round_trips import round_trips

    rows, spent = round_trips(lambda: rows_walking(SEEN, {}))
    assert rows == [{"sort": "off", "jit": "off"}]
    assert spent == 1


@pytest.mark.django_db(transaction=True)
def test_on_a_preparing_connection_a_stale_plan_is_planned_again(settings, monkeypatch):
    """Where the connection prepares (``queueing.sql.prepares``), a statement whose table
    changed under its prepared plan (a deploy's migration) runs again on a new one: the
    refusal arrives at the pipeline's sync, where the cursor's own replan cannot see it."""
    monkeypatch.setitem(settings.DATABASES["default"]["OPTIONS"], "prepare_threshold", 0)
    connection.close()
    try:
        with connection.cursor() as cursor:
            cursor.execute("CREATE TABLE pgstage_planner_probe (a int)")
            cursor.execute("INSERT INTO pgstage_planner_probe VALUES (1)")
        probe = "SELECT * FROM pgstage_planner_probe WHERE a = %(a)s"
        assert rows_walking(probe, {"a": 1}) == [{"a": 1}]
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pgstage_planner_probe ADD COLUMN b int DEFAULT 2")
        assert rows_walking(probe, {"a": 1}) == [{"a": 1, "b": 2}]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE IF EXISTS pgstage_planner_probe")
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_inside_the_callers_transaction_its_own_settings_come_back():
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL jit = off")
        assert rows_walking(SEEN, {}) == [{"sort": "off", "jit": "off"}]
        assert _settings() == ("on", "off")
    assert _settings() == ("on", "on")


@pytest.mark.django_db(transaction=True)
def test_a_transaction_begun_by_hand_gets_its_own_settings_back():
    """A transaction Django does not know of (``BEGIN`` on a cursor): the statement runs in
    it, not in a pipeline's implicit one, and its settings come back after it."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            assert rows_walking(SEEN, {}) == [{"sort": "off", "jit": "off"}]
            assert _settings() == ("on", "on")
        finally:
            cursor.execute("ROLLBACK")


@pytest.mark.django_db(transaction=True)
def test_on_another_connector_an_error_is_the_connectors():
    """As procrastinate's connectors raise it, so that a worker's loops retry it."""
    from procrastinate.contrib.django.django_connector import DjangoConnector

    with pytest.raises(ConnectorException):
        asyncio.run(rows_walking_async(DjangoConnector(), FAILS, zero=0))


@pytest.fixture
def walked(monkeypatch):
    """The statements each call site sends through the planner's settings."""
    import queueing.jobs
    import queueing.worker
    import runs.processing
    import runs.selectors

    seen: list[str] = []
    for module in (queueing.jobs, runs.processing, runs.selectors):
        real = module.rows_walking

        def walking(query, params, real=real):
            seen.append(query)
            return real(query, params)

        monkeypatch.setattr(module, "rows_walking", walking)
    real_async = queueing.worker.rows_walking_async

    async def walking_async(connector, query, **arguments):
        seen.append(query)
        if query == queueing.worker.queries["fetch_job"]:
            # The fetch runs on its generic plan (test_a_generic_walk_is_prepared_at_once…).
            assert arguments.get("generic") is True
        return await real_async(connector, query, **arguments)

    monkeypatch.setattr(queueing.worker, "rows_walking_async", walking_async)
    return seen


def test_every_walk_of_an_index_runs_under_the_settings(clean_queue, walked):
    """The rows-read tests measure these statements under the settings; here each call
    site is seen to send them so (a site that lost them would read every waiting job)."""
    from asgiref.sync import async_to_sync
    from procrastinate.contrib.django import app

    from queueing import worker
    from queueing.jobs import unrunnable_tasks
    from queueing.sql import queries as queueing_queries
    from runs import processing, selectors
    from runs.core import queries as runs_queries

    unrunnable_tasks()
    processing.analysis_jobs_requeue_lost(idle_seconds=60)
    selectors.resume_work(idle_seconds=60, held_seconds=600)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker_id,) = cursor.fetchone()
    async_to_sync(worker.fetch_by_task_name(app).fetch_job)(queues=None, worker_id=worker_id)
    assert walked == [
        queueing_queries["unrunnable_tasks"],
        runs_queries["lost_process_jobs"],
        runs_queries["resume_work"],
        worker.queries["fetch_job"],
    ]


@pytest.mark.django_db(transaction=True)
def test_on_djangos_connector_the_walk_runs_on_its_database_alias():
    """procrastinate's Django connector names a database alias; the walk runs there, not
    on the default one, and an error there is the connector's."""
    from asgiref.sync import async_to_sync
    from django.db import connections
    from procrastinate.contrib.django.django_connector import DjangoConnector

    default = connections["default"]
    probe = {
        **default.settings_dict,
        "OPTIONS": {
            **default.settings_dict.get("OPTIONS", {}),
            "application_name": "pgstage-walk-alias-probe",
        },
    }
    named = (
        "SELECT current_setting('application_name') AS name, current_setting('enable_sort') AS sort"
    )
    # Made here, not in the settings (the test database's alias list stays as it is):
    # a connection of this thread only, where async_to_sync runs the walk's sync part.
    connections._connections.walk_probe = type(default)(probe, alias="walk_probe")
    try:
        on_probe = [{"name": "pgstage-walk-alias-probe", "sort": "off"}]
        assert rows_walking(named, {}, using="walk_probe") == on_probe
        assert rows_walking(named, {})[0]["name"] != "pgstage-walk-alias-probe"
        walk = async_to_sync(rows_walking_async)
        assert walk(DjangoConnector(alias="walk_probe"), named) == on_probe
        assert walk(DjangoConnector(), named)[0]["name"] != "pgstage-walk-alias-probe"
        with pytest.raises(ConnectorException):
            walk(DjangoConnector(alias="walk_probe"), FAILS, zero=0)
        assert walk(DjangoConnector(alias="walk_probe"), named) == on_probe
    finally:
        connections["walk_probe"].close()
        del connections._connections.walk_probe
