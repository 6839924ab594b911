"""The index walks' planner settings (``queueing.planner``): the statement runs under them,
in one round trip on the worker's pool, and they end with it, on success and on failure.

Fault model: a setting that outlived its statement would change the plans of whatever
ran next on that pooled or Django connection (sorts disabled for a report, JIT off for an
analytics query); one that did not reach the statement would leave the fetch on the plan
that read every waiting job (``tests/queueing/test_fetch.py``)."""

from __future__ import annotations

import asyncio
import re

import django.db
import psycopg
import pytest
from django.db import connection, transaction
from procrastinate.exceptions import ConnectorException

from queueing.planner import FETCH_SETTINGS, rows_walking, rows_walking_async

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


#: The fetch function's own settings (its SET clauses), as pg_proc keeps them.
FETCH_FUNCTION_SETTINGS = [
    "enable_sort=off",
    "jit=off",
    "enable_seqscan=off",
    "enable_hashjoin=off",
    "enable_mergejoin=off",
    "plan_cache_mode=force_generic_plan",
]


@pytest.mark.django_db(transaction=True)
def test_the_fetch_function_plans_under_the_fetch_settings_and_keeps_a_generic_plan():
    """``pgstage_fetch_job_v1`` carries FETCH_SETTINGS and the generic plan as its own
    settings, which PostgreSQL applies for the call and undoes after it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT proconfig FROM pg_proc WHERE proname = 'pgstage_fetch_job_v1'")
        (config,) = cursor.fetchone()
    assert config == FETCH_FUNCTION_SETTINGS
    # FETCH_SETTINGS (the statement the tests plan the function's statement under) says
    # the same as the function's clauses but the plan cache's mode.
    said = dict(re.findall(r"set_config\('(\w+)', '(\w+)', true\)", FETCH_SETTINGS))
    assert said == dict(c.split("=") for c in FETCH_FUNCTION_SETTINGS[:-1])


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("prepare_threshold", ["prepares", None])
def test_the_fetch_is_one_round_trip_and_leaves_the_session_as_it_was(
    settings, monkeypatch, prepare_threshold
):
    """On the worker's pool, directly or behind a transaction pooler (``OPTIONS
    ["prepare_threshold"] = None``: nothing prepared): each fetch is one round trip (and
    preparing the call, once per connection, one more), and whatever runs next on that
    connection runs under the session's own settings."""
    from procrastinate.contrib.django import app

    from queueing.connector import PREPARE_THRESHOLD, worker_connector
    from queueing.worker import TaskNameJobManager
    from tests.queueing.test_round_trips import _on_the_wire

    if prepare_threshold is None:
        monkeypatch.setitem(settings.DATABASES["default"]["OPTIONS"], "prepare_threshold", None)

    async def body(connector, counter):
        await connector.open_async()
        try:
            manager = TaskNameJobManager(connector=connector, tasks=lambda: app.tasks)
            worker_id = await manager.register_worker()
            spent = []
            for _ in range(8):
                before = counter.snapshot()
                assert await manager.fetch_job(queues=None, worker_id=worker_id) is None
                spent.append((counter.snapshot() - before).round_trips)
            after = await connector.execute_query_one_async(
                "SELECT current_setting('enable_sort') AS sort, current_setting('jit') AS jit,"
                " current_setting('enable_seqscan') AS seqscan,"
                " current_setting('plan_cache_mode') AS mode"
            )
            prepared = await connector.execute_query_all_async(
                "SELECT name FROM pg_prepared_statements"
            )
            return spent, after, prepared
        finally:
            await connector.close_async()

    spent, after, prepared = _on_the_wire(lambda: worker_connector(min_size=1, max_size=1), body)
    if prepare_threshold is None:
        assert spent == [1] * 8
    else:  # prepared on its sixth run (psycopg's threshold): a parse of its own, once
        assert spent == [1] * PREPARE_THRESHOLD + [2] + [1] * (7 - PREPARE_THRESHOLD)
    assert after == {"sort": "on", "jit": "on", "seqscan": "on", "mode": "auto"}
    assert bool(prepared) is (prepare_threshold is not None)


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
        return await real_async(connector, query, **arguments)

    monkeypatch.setattr(queueing.worker, "rows_walking_async", walking_async)
    return seen


def test_every_walk_of_an_index_runs_under_the_settings(clean_queue, walked):
    """The rows-read tests measure these statements under the settings; here each call
    site is seen to send them so (a site that lost them would read every waiting job).
    The fetch carries its own (the function's, test_the_fetch_function_plans_under_…)."""
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
