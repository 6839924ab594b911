"""The hot path is lean: enqueue, claim and complete are one statement each; a serial
queue's admit is one round trip; the worker's fetch, outcome and defer are one round trip
each, and a stage job on a real worker three: fetch, claim, and complete with the next hop and
the job's success (counted on the wire)."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import Policy, enqueue
from queueing.ledger import Ledger
from tests.queueing.models import Step

LEDGER = Ledger(model=Step, key_fields=("unit", "stage"))

pytestmark = pytest.mark.django_db(transaction=True)


def statements(func) -> tuple[object, int]:
    with CaptureQueriesContext(connection) as captured:
        result = func()
    return result, len(captured)


def round_trips(func) -> tuple[object, int]:
    """``func`` run on a Django connection through a counting proxy (``bench.wire``): its
    result and the round trips it waited on (BEGIN and COMMIT included)."""
    from bench.scenarios.common import through
    from bench.wire import WireCounter

    with WireCounter(_params()) as counter:

        def counted() -> tuple[object, int]:
            before = counter.snapshot()
            result = func()
            return result, (counter.snapshot() - before).round_trips

        return through(counter, counted)


def test_a_serial_admit_is_one_round_trip_with_its_lock_its_job_and_its_commit(clean_queue):
    """The lock, the statement (the row, its start job) and the COMMIT travel together."""
    from queueing import locks
    from queueing.serial import SerialQueue, StartJob
    from tests.conftest import jobs
    from tests.queueing.models import Item

    queue = SerialQueue(
        model=Item,
        namespace=locks.namespace("test_round_trips_serial"),
        key_field="owner",
        parent_field="parent",
        deleted_field="deleted_at",
    )
    job = StartJob(task="tests.record", id_arg="item", args={"label": "x"})
    first, n = round_trips(lambda: queue.admit(key="rt", values={}, start_job=job))
    assert (first.status, n) == ("pending", 1)
    second, n = round_trips(lambda: queue.admit(key="rt", values={}, start_job=job))
    assert (second.status, second.position, n) == ("queued", 1, 1)
    assert [j["args"] for j in jobs()] == [{"label": "x", "item": first.id}]


def test_enqueue_is_one_statement_when_it_creates_and_when_it_dedups(clean_queue):
    created, n = statements(
        lambda: enqueue("tests.record", args={"label": "a"}, key="rt:1", policy=Policy.EXCLUSIVE)
    )
    assert created.created and n == 1
    dedup, n = statements(
        lambda: enqueue("tests.record", args={"label": "b"}, key="rt:1", policy=Policy.EXCLUSIVE)
    )
    assert not dedup.created and dedup.job_id == created.job_id and n == 1


def test_claim_and_complete_are_one_statement_each():
    claim, n = statements(lambda: LEDGER.claim(unit="rt", stage="s"))
    assert claim.claimed and n == 1
    _, n = statements(lambda: LEDGER.complete(claim))
    assert n == 1
    done, n = statements(lambda: LEDGER.claim(unit="rt", stage="s"))
    assert not done.claimed and n == 1


def test_complete_and_the_next_job_are_one_statement_and_both_or_neither(clean_queue):
    from queueing.enqueue import job_params
    from queueing.exceptions import LeaseLost
    from tests.conftest import jobs

    def next_job(unit: str) -> dict:
        return job_params(
            "tests.record", args={"label": unit}, key=f"next:{unit}", policy=Policy.EXCLUSIVE
        )

    claim = LEDGER.claim(unit="rt2", stage="s")
    _, n = statements(lambda: LEDGER.complete(claim, then=next_job("a")))
    assert n == 1
    assert [j["queueing_lock"] for j in jobs()] == ["exclusive/next:a"]

    # A job already holding the key is left as it is: no error, no second job.
    again = LEDGER.claim(unit="rt3", stage="s")
    LEDGER.complete(again, then=next_job("a"))
    assert len(jobs()) == 1

    # A stale token closes nothing and enqueues nothing.
    stale = LEDGER.claim(unit="rt4", stage="s")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE test_steps SET attempts = attempts + 1 WHERE id = %s", [stale.entry_id]
        )
    with pytest.raises(LeaseLost):
        LEDGER.complete(stale, then=next_job("b"))
    assert len(jobs()) == 1


def test_the_workers_connector_spends_one_round_trip_per_statement(clean_queue):
    """fetch, finish and a defer through the worker's connector: no BEGIN, no COMMIT, no
    liveness check of the lent connection."""

    from procrastinate import jobs as procrastinate_jobs
    from procrastinate.contrib.django import app

    from queueing.connector import worker_connector
    from queueing.worker import TaskNameJobManager
    from tests.conftest import jobs

    enqueue("tests.record", args={"label": "w"})

    async def body(connector, counter) -> list[int]:
        await connector.open_async()
        try:
            manager = TaskNameJobManager(connector=connector, tasks=lambda: app.tasks)
            worker_id = await manager.register_worker()
            spent = []
            before = counter.snapshot()
            job = await manager.fetch_job(queues=None, worker_id=worker_id)
            spent.append((counter.snapshot() - before).round_trips)
            before = counter.snapshot()
            await manager.finish_job(
                job, status=procrastinate_jobs.Status.SUCCEEDED, delete_job=False
            )
            spent.append((counter.snapshot() - before).round_trips)
            before = counter.snapshot()
            await manager.defer_job_async(
                procrastinate_jobs.Job(
                    id=None,
                    queue="default",
                    lock=None,
                    queueing_lock=None,
                    task_name="tests.record",
                    task_kwargs={"label": "d"},
                )
            )
            spent.append((counter.snapshot() - before).round_trips)
            return spent
        finally:
            await connector.close_async()

    spent = _on_the_wire(lambda: worker_connector(min_size=2, max_size=2), body)
    assert spent == [1, 1, 1]
    assert [j["status"] for j in jobs()] == ["succeeded", "todo"]


def test_the_workers_connector_replaces_a_pooled_connection_the_server_ended(transactional_db):
    """A connection terminated while it sat in the pool is not lent: the statement runs on
    a fresh one instead of failing, with no round trip spent on checking."""
    import asyncio

    from queueing.connector import worker_connector

    async def body() -> tuple[int, int]:
        connector = worker_connector(min_size=1, max_size=1)
        await connector.open_async()
        try:
            query = "SELECT pg_backend_pid() AS pid"
            first = (await connector.execute_query_one_async(query))["pid"]
            await asyncio.to_thread(_terminate, first)
            second = (await connector.execute_query_one_async(query))["pid"]
            return first, second
        finally:
            await connector.close_async()

    first, second = asyncio.run(body())
    assert second != first


def _fetches_on_one_connection(connector_factory) -> tuple[bool, int]:
    """Seven fetches through a one-connection worker connector: whether the fetch is then
    a prepared statement of that connection, and the round trips the last fetch took."""

    from procrastinate.contrib.django import app

    from queueing.worker import TaskNameJobManager

    async def body(connector, counter) -> tuple[bool, int]:
        await connector.open_async()
        try:
            manager = TaskNameJobManager(connector=connector, tasks=lambda: app.tasks)
            worker_id = await manager.register_worker()
            for _ in range(6):
                await manager.fetch_job(queues=None, worker_id=worker_id)
            before = counter.snapshot()
            await manager.fetch_job(queues=None, worker_id=worker_id)
            spent = (counter.snapshot() - before).round_trips
            row = await connector.execute_query_one_async(
                "SELECT count(*) > 0 AS prepared FROM pg_prepared_statements"
                " WHERE statement LIKE %(fetch)s",
                fetch="%pgstage_fetch_job_v1(%",
            )
            return row["prepared"], spent
        finally:
            await connector.close_async()

    return _on_the_wire(connector_factory, body)


def test_the_workers_connector_prepares_its_fetch(clean_queue, monkeypatch):
    """A worker's pool prepares its fetch (the function's call) once per connection, from
    its fifth run, each fetch still one round trip; a database whose OPTIONS say
    ``prepare_threshold: None`` (e.g. behind a transaction pooler) prepares nothing."""
    from queueing.connector import worker_connector

    def connector():
        return worker_connector(min_size=1, max_size=1)

    assert _fetches_on_one_connection(connector) == (True, 1)
    options = settings.DATABASES["default"].setdefault("OPTIONS", {})
    monkeypatch.setitem(options, "prepare_threshold", None)
    assert _fetches_on_one_connection(connector) == (False, 1)


#: A worker whose own loops (heartbeat, stalled recovery, owed hooks) are rare, so the
#: count is the jobs', not the loops' (a slow machine stretches the batch, not the loops).
QUIET = {
    "WORKER_HEARTBEAT_SECONDS": "20",
    "STALLED_WORKER_SECONDS": "120",
    "STALLED_RECOVERY_SECONDS": "40",
}


@pytest.mark.slow
def test_a_stage_job_on_a_real_worker_costs_three_round_trips(clean_queue, task_worker):
    """fetch, claim, complete with the next hop's enqueue and the job's own success: one
    round trip each, counted on the wire between a real worker and the server (whatever
    else the worker sends meanwhile counts too); the worker saves no outcome after it."""
    from bench.wire import WireCounter
    from tests.conftest import jobs, wait_for

    n = 40
    with WireCounter(_params()) as counter:
        worker = task_worker("--queues=rt_stage", env={**QUIET, "DATABASE_URL": counter.url})
        before = counter.snapshot()
        with transaction.atomic():
            for i in range(n):
                enqueue("tests.stage_hop", args={"unit": f"u{i}"}, queue="rt_stage")
        wait_for(
            lambda: len(jobs(status="succeeded")) == n,
            message=f"the stage jobs\n{worker.log()[-1500:]}",
        )
        time.sleep(0.3)  # the last outcome's reply passes the counter
        spent = counter.snapshot() - before
    assert len([j for j in jobs() if j["task_name"] == "tests.record"]) == n
    per_job = spent.per(n)
    # Three per job; what the worker sends meanwhile (periodic defers, heartbeats) rides on
    # top, more of it the slower the machine.
    assert per_job["round_trips"] <= 4, per_job


def _params() -> dict:
    db = connection.settings_dict
    return {
        "host": db["HOST"] or "127.0.0.1",
        "port": db["PORT"] or 5432,
        "user": db["USER"],
        "password": db["PASSWORD"],
        "dbname": db["NAME"],
    }


def _terminate(pid: int) -> None:
    """End backend ``pid`` and wait until it is gone (its goodbye is on its socket)."""
    import time

    from django.db import connections

    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
            if cursor.fetchone()[0] == 0:
                return
            time.sleep(0.01)
    raise AssertionError(f"backend {pid} did not end")


def _on_the_wire(connector, body):
    """``body(connector(), counter)`` (a coroutine function) with the connector built
    through a counting proxy (``bench.wire``); its result."""
    import asyncio

    from bench.scenarios.common import through
    from bench.wire import WireCounter

    with WireCounter(_params()) as counter:
        return through(counter, lambda: asyncio.run(body(connector(), counter)))
