"""The statement cursor (queueing.sql.statement_cursor, preparing) runs each statement in
one round trip whatever psycopg's cache of prepared statements forgot meanwhile: a
rollback, a savepoint's, an eviction past ``prepared_max``; and whatever types the
parameters have this time (psycopg prepares a statement once per set of types)."""

from __future__ import annotations

import datetime

import pytest
from django.db import DataError, connection, transaction

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.sql import pipelined, statement_cursor

pytestmark = pytest.mark.django_db(transaction=True)

PROBE = "SELECT 1 AS one /* pgstage prepared probe */ WHERE %s IS NOT DISTINCT FROM %s"
NOW = datetime.datetime.now(datetime.UTC)


def round_trips(scenario) -> list[int]:
    """Round trips of each ``run(*params, query=PROBE)`` the scenario makes, counted on
    the wire; every run on the test's one connection, which prepares."""
    from bench.scenarios.common import through
    from bench.wire import WireCounter
    from tests.queueing.test_round_trips import _params

    with WireCounter(_params()) as counter:

        def counted() -> list[int]:
            assert connection.connection.prepare_threshold is not None
            marks: list[int] = []

            def run(*params, query=PROBE):
                before = counter.snapshot()
                try:
                    with statement_cursor(connection) as cursor:
                        cursor.execute(query, list(params))
                        cursor.fetchall()
                finally:
                    marks.append((counter.snapshot() - before).round_trips)

            scenario(run)
            return marks

        return through(counter, counted)


def fail_in_atomic(run, *params, **kwargs) -> None:
    with pytest.raises(ZeroDivisionError), transaction.atomic():
        run(*params, **kwargs)
        1 / 0  # noqa: B018


@pytest.mark.parametrize(
    "variants",
    [
        pytest.param([(None, None), (None, None), (NOW, NOW)], id="None-then-timestamptz"),
        pytest.param([(1, 1), (2, 2), (40000, 40000)], id="int2-then-int4"),
    ],
)
def test_parameters_of_new_types_prepare_in_one_round_trip(variants):
    """enqueue's scheduled_at (None or a datetime), a claim's job id (None, or an id past
    32,767): one statement text, another prepared statement."""
    assert round_trips(lambda run: [run(*v) for v in variants]) == [1, 1, 1]


def test_each_type_variant_prepares_again_in_one_round_trip_after_a_rollback():
    def scenario(run):
        run(None, None)
        run(NOW, NOW)
        fail_in_atomic(run, None, None)
        run(None, None)
        run(NOW, NOW)

    assert round_trips(scenario)[3:] == [1, 1]


def test_after_a_rolled_back_savepoint_the_next_run_is_one_round_trip():
    def scenario(run):
        run(1, 1)
        with transaction.atomic():
            run(1, 1)
            fail_in_atomic(run, 1, 1)
            run(1, 1)
            fail_in_atomic(run, 1, 1)
            run(1, 1)

    marks = round_trips(scenario)
    assert marks[3] == 1 and marks[5] == 1, marks


def test_a_statement_evicted_past_prepared_max_prepares_in_one_round_trip():
    def scenario(run):
        connection.connection.prepared_max = 2
        for tag in ("a", "b", "c", "a"):
            run(1, 1, query=f"{PROBE} /* {tag} */")

    assert round_trips(scenario)[3] == 1


@pytest.mark.parametrize("first_fails", [True, False])
def test_a_failed_run_leaves_the_next_ones_one_round_trip(first_fails):
    query = "SELECT 1 / %s AS x /* pgstage prepared probe, failing */"

    def scenario(run):
        if not first_fails:
            run(1, query=query)
        with pytest.raises(DataError):  # division by zero
            run(0, query=query)
        run(1, query=query)
        run(1, query=query)

    assert round_trips(scenario)[-2:] == [1, 1]


def test_a_run_in_the_callers_pipeline_then_alone_is_one_round_trip_each():
    def scenario(run):
        run(1, 1)
        fail_in_atomic(run, 1, 1)
        with pipelined(connection), statement_cursor(connection) as cursor:
            cursor.execute(PROBE, [1, 1])
        run(1, 1)

    assert round_trips(scenario)[-1] == 1


def test_executemany_then_execute_after_a_rollback_is_one_round_trip():
    query = "SELECT %s::int AS x /* pgstage prepared probe, many */"

    def scenario(run):
        with statement_cursor(connection) as cursor:
            cursor.executemany(query, [[1], [2]])
        run(3, query=query)
        fail_in_atomic(run, 3, query=query)
        run(3, query=query)

    assert round_trips(scenario)[-1] == 1


def test_enqueue_scheduled_after_unscheduled_is_one_round_trip_each(clean_queue):
    """enqueue()'s INSERT with no schedule (scheduled_at None), then with one."""
    from bench.scenarios.common import through
    from bench.wire import WireCounter
    from queueing.enqueue import enqueue
    from tests.queueing.test_round_trips import _params

    with WireCounter(_params()) as counter:

        def counted() -> list[int]:
            marks = []
            for kwargs in ({}, {}, {"schedule_in": datetime.timedelta(hours=1)}):
                before = counter.snapshot()
                enqueue("tests.record", args={"label": "x"}, **kwargs)
                marks.append((counter.snapshot() - before).round_trips)
            return marks

        assert through(counter, counted) == [1, 1, 1]


ORPHAN = (
    "INSERT INTO test_items (owner, status, parent_id, created_at, updated_at, label)"
    " VALUES (%s, 'pending', %s, now(), now(), '') RETURNING id /* {tag} */"
)


@pytest.mark.parametrize("runs_before", [0, 1])
def test_a_constraint_that_fails_at_the_commit_is_an_integrity_error(runs_before):
    """Django's foreign keys are checked at commit. A statement's first run on a
    connection goes in a pipeline of its own, whose commit is a COMMIT it sends, not the
    pipeline's implicit one at its Sync (after which psycopg's connection is unusable):
    a row referring to one that is gone is an IntegrityError, and the session goes on."""
    from django.db import IntegrityError

    from tests.queueing.models import Item

    query = ORPHAN.format(tag=f"orphan {runs_before}")
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is not None
    parent = Item.objects.create(owner="orphans", status="pending")
    for _ in range(runs_before):
        with statement_cursor(connection) as cursor:
            cursor.execute(query, ["orphans", parent.pk])
    with pytest.raises(IntegrityError), statement_cursor(connection) as cursor:
        cursor.execute(query, ["orphans", 987654321])
    assert Item.objects.filter(owner="orphans").count() == 1 + runs_before
    with statement_cursor(connection) as cursor:
        cursor.execute(query, ["orphans", parent.pk])
        assert cursor.fetchone()[0] > parent.pk


def test_a_statement_over_psycopgs_cache_limit_is_converted_once_per_process():
    """psycopg caches its conversion of ``%(name)s`` placeholders only for statements of
    at most 4 kB (the admission's is over 5 kB): the preparing cursor caches every one,
    and each run still binds its own parameters."""
    from queueing import sql

    if sql.converted_texts is None:
        pytest.skip("this psycopg lacks the conversion the cache wraps")
    statement = "SELECT %(a)s::int + %(b)s::int /* " + "x" * 5000 + " */"
    before = sql.converted_texts.cache_info()
    results = []
    for a in range(3):
        with sql.preparing_cursor(connection) as cursor:
            cursor.execute(statement, {"a": a, "b": 10})
            results.append(cursor.fetchone()[0])
    after = sql.converted_texts.cache_info()
    assert results == [10, 11, 12]
    assert after.misses - before.misses == 1
    assert after.hits - before.hits >= 2
