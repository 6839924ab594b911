from __future__ import annotations

import threading

import pytest

from queueing import locks
from queueing.serial import SerialQueue
from tests.conftest import run_concurrently
from tests.queueing.models import Item

QUEUE = SerialQueue(
    model=Item,
    namespace=locks.namespace("test_serial"),
    key_field="owner",
    parent_field="parent",
    deleted_field="deleted_at",
)

pytestmark = pytest.mark.django_db(transaction=True)


def statuses(owner: str) -> list[str]:
    return list(Item.objects.filter(owner=owner).order_by("id").values_list("status", flat=True))


def finish(item_id: int) -> None:
    Item.objects.filter(pk=item_id).update(status="complete")


def test_fifty_concurrent_admits_one_active_fortynine_queued_promoted_fifo():
    results = run_concurrently(lambda i: QUEUE.admit(key="alice", values={"label": f"job-{i}"}), 50)
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert sorted(r.status for r in results).count("pending") == 1
    assert statuses("alice").count("queued") == 49

    # Drain: finish the active one, promote, repeat — order must follow created_at.
    order = []
    active = Item.objects.get(owner="alice", status="pending")
    for _ in range(50):
        order.append(active.pk)
        Item.objects.filter(pk=active.pk).update(status="running")
        assert QUEUE.promote(key="alice") is None  # slot is taken
        finish(active.pk)
        promoted = QUEUE.promote(key="alice")
        if promoted is None:
            break
        active = Item.objects.get(pk=promoted)
    expected = list(
        Item.objects.filter(owner="alice").order_by("created_at", "id").values_list("pk", flat=True)
    )
    assert order == expected
    assert set(statuses("alice")) == {"complete"}


def test_two_promoters_at_once_start_one_job():
    first = QUEUE.admit(key="bob", values={})
    for _ in range(5):
        QUEUE.admit(key="bob", values={})
    finish(first.id)
    results = run_concurrently(lambda i: QUEUE.promote(key="bob"), 10)
    assert len([r for r in results if r is not None]) == 1
    assert statuses("bob").count("pending") == 1


def test_keys_are_independent():
    assert QUEUE.admit(key="carol", values={}).status == "pending"
    assert QUEUE.admit(key="dave", values={}).status == "pending"
    assert QUEUE.admit(key="carol", values={}).status == "queued"


def test_children_bypass_the_queue_and_never_block_it():
    parent = QUEUE.admit(key="erin", values={})
    queued = [QUEUE.admit(key="erin", values={}) for _ in range(5)]
    assert {q.status for q in queued} == {"queued"}
    child = QUEUE.admit(key="erin", values={"parent_id": parent.id})
    assert child.status == "pending"
    finish(parent.id)
    # An active child does not hold the slot.
    assert QUEUE.promote(key="erin") == queued[0].id


def test_deleted_rows_neither_hold_nor_wait():
    active = QUEUE.admit(key="frank", values={})
    Item.objects.filter(pk=active.id).update(deleted_at="2020-01-01T00:00:00Z")
    assert QUEUE.admit(key="frank", values={}).status == "pending"


def test_stuck_keys_are_promoted_by_the_resume_pass():
    a = QUEUE.admit(key="gina", values={})
    b = QUEUE.admit(key="gina", values={})
    finish(a.id)  # e.g. the worker died before promoting
    assert QUEUE.stuck_keys() == ["gina"]
    assert QUEUE.promote_stuck() == [b.id]
    assert QUEUE.stuck_keys() == []


def test_positions_count_from_one_in_fifo_order():
    QUEUE.admit(key="hank", values={})
    queued = [QUEUE.admit(key="hank", values={}) for _ in range(3)]
    rows = {i.pk: i for i in Item.objects.filter(owner="hank")}
    assert [
        QUEUE.position(key="hank", row_id=q.id, created=rows[q.id].created_at) for q in queued
    ] == [1, 2, 3]


def test_admit_waits_for_a_concurrent_admit_holding_the_lock():
    """Two tabs: the second admit blocks on the first's lock and then sees its row."""
    from django.db import transaction

    started = threading.Event()
    release = threading.Event()
    outcome = {}

    def slow_admit():
        try:
            with transaction.atomic():
                outcome["first"] = QUEUE.admit(key="ivy", values={})
                started.set()
                release.wait(timeout=10)
        finally:
            from django.db import connections

            connections.close_all()

    t = threading.Thread(target=slow_admit)
    t.start()
    assert started.wait(timeout=10)

    def second():
        try:
            outcome["second"] = QUEUE.admit(key="ivy", values={})
        finally:
            from django.db import connections

            connections.close_all()

    t2 = threading.Thread(target=second)
    t2.start()
    t2.join(timeout=0.5)
    assert t2.is_alive(), "second admit must wait for the lock"
    release.set()
    t.join(timeout=10)
    t2.join(timeout=10)
    assert outcome["first"].status == "pending"
    assert outcome["second"].status == "queued"


def test_a_row_cancelled_while_promote_waits_on_it_is_not_started():
    """promote's UPDATE may wait on the row it picked; after the wait it re-checks that the
    row is still queued, so a cancellation (made without the key's lock) wins."""
    from django.db import connections, transaction

    first = QUEUE.admit(key="jill", values={})
    second = QUEUE.admit(key="jill", values={})
    finish(first.id)
    cancelling = threading.Event()
    release = threading.Event()

    def cancel_without_the_lock():
        try:
            with transaction.atomic():
                Item.objects.filter(pk=second.id).update(status="cancelled")
                cancelling.set()
                release.wait(timeout=10)
        finally:
            connections.close_all()

    canceller = threading.Thread(target=cancel_without_the_lock)
    canceller.start()
    assert cancelling.wait(timeout=10)
    outcome = {}

    def promote():
        try:
            outcome["promoted"] = QUEUE.promote(key="jill")
        finally:
            connections.close_all()

    promoter = threading.Thread(target=promote)
    promoter.start()
    promoter.join(timeout=0.5)
    assert promoter.is_alive(), "promote must wait on the row being cancelled"
    release.set()
    canceller.join(timeout=10)
    promoter.join(timeout=10)
    assert outcome["promoted"] is None
    assert Item.objects.get(pk=second.id).status == "cancelled"


def test_a_late_admit_never_jumps_the_queue_and_the_oldest_starts():
    """The slot was freed without a promotion (a crash, an operator): a new admit waits
    behind the older queued rows, and the oldest of them starts in the same admission."""
    first = QUEUE.admit(key="gina", values={"label": "first"})
    second = QUEUE.admit(key="gina", values={"label": "second"})
    third = QUEUE.admit(key="gina", values={"label": "third"})
    finish(first.id)  # nobody promoted: 'second' and 'third' wait with a free slot

    late = QUEUE.admit(key="gina", values={"label": "late"})

    assert late.status == "queued" and late.promoted == second.id
    assert statuses("gina") == ["complete", "pending", "queued", "queued"]
    assert QUEUE.promote(key="gina") is None
    assert third.status == "queued"


def test_an_admit_whose_statement_fails_leaves_nothing_and_its_session_usable():
    """The pipeline's statement fails after its BEGIN and its lock: the error reaches the
    caller, the block is rolled back (no row, the lock released) and the next admit on
    the same session works."""
    from django.db import DataError

    with pytest.raises(DataError):
        QUEUE.admit(key="kim", values={}, guard="1 / 0 = 1")
    assert statuses("kim") == []
    assert QUEUE.admit(key="kim", values={}).status == "pending"


def test_an_admit_of_its_own_runs_its_statement_on_the_generic_plan(monkeypatch):
    """Outside a transaction, in a transaction of its own (queueing.sql.committed sends
    its BEGIN and COMMIT): the generic plan, the lock and the statement. The statement is
    never planned with its values, even on the connection's first runs, and the session's
    plan_cache_mode is its own again after the COMMIT."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    connection.ensure_connection()
    monkeypatch.setattr(connection.connection, "prepare_threshold", 5)
    with CaptureQueriesContext(connection) as captured:
        admitted = [QUEUE.admit(key="noa", values={}) for _ in range(3)]
    assert [a.status for a in admitted] == ["pending", "queued", "queued"]
    sent = [q["sql"].split("(")[0].strip() for q in captured.captured_queries]
    assert (
        sent
        == [
            "SET LOCAL plan_cache_mode = force_generic_plan",
            "SELECT pg_advisory_xact_lock",
            "WITH siblings AS",
        ]
        * 3
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%WITH siblings AS%"],
        )
        assert cursor.fetchall() == [(3, 0)]
        cursor.execute("SELECT current_setting('plan_cache_mode')")
        assert cursor.fetchone() == ("auto",)


@pytest.mark.parametrize("threshold", [5, None])
@pytest.mark.parametrize("guard", [None, "true"])
def test_a_constraint_that_fails_at_the_commit_is_an_integrity_error(threshold, guard, monkeypatch):
    """Django's foreign keys are checked at the COMMIT (deferred): a child of a parent
    that is gone fails there, as an IntegrityError, and the session goes on working (the
    pipeline's implicit commit at its Sync would leave psycopg's connection broken)."""
    from django.db import IntegrityError, connection

    from tests.queueing.models import Item

    connection.ensure_connection()
    monkeypatch.setattr(connection.connection, "prepare_threshold", threshold)
    with pytest.raises(IntegrityError):
        QUEUE.admit(key="oda", values={"parent": 987654321}, guard=guard)
    assert Item.objects.filter(owner="oda").count() == 0
    assert QUEUE.admit(key="oda", values={}).status == "pending"


def _prepared_admits() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%WITH siblings AS%"],
        )
        return cursor.fetchone()[0]


@pytest.mark.parametrize("threshold", [5, None])
def test_an_admit_is_prepared_once_where_the_connection_allows_it(threshold, monkeypatch):
    """A connection whose database allows prepared statements (``prepare_threshold``)
    plans an admit of one shape once, however often it runs; NULLs, a child and a refusal
    admit as before. One that does not (behind a transaction pooler) prepares nothing."""
    from django.db import connection

    connection.ensure_connection()
    monkeypatch.setattr(connection.connection, "prepare_threshold", threshold)
    admitted = [QUEUE.admit(key="lea", values={"label": f"a{i}"}) for i in range(5)]
    assert [a.position for a in admitted] == [0, 1, 2, 3, 4]
    assert _prepared_admits() == (0 if threshold is None else 1)
    nulls = QUEUE.admit(key="lea", values={"deleted_at": None})
    child = QUEUE.admit(key="lea", values={"parent_id": admitted[0].id})
    refused = QUEUE.admit(key="lea", values={}, guard="false", report="(SELECT 7)")
    assert (nulls.status, nulls.position) == ("queued", 5)
    assert child.status == "pending" and refused.report == (7,)
    assert statuses("lea") == ["pending"] + ["queued"] * 5 + ["pending"]
    if threshold is None:
        assert _prepared_admits() == 0
