"""The hot path is lean: enqueue, claim and complete are one statement each; a serial
queue's admit is one round trip (counted on the wire)."""

from __future__ import annotations

import pytest
from django.db import connection
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

    db = connection.settings_dict
    params = {
        "host": db["HOST"] or "127.0.0.1",
        "port": db["PORT"] or 5432,
        "user": db["USER"],
        "password": db["PASSWORD"],
        "dbname": db["NAME"],
    }
    with WireCounter(params) as counter:

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
