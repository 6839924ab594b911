"""A pipeline's statements reach the server together, when its block ends
(``queueing.sql.held_pipeline``, under ``committed``, ``pipelined`` and the statement
cursor's first runs).

Fault model — what a held pipeline can meet; what must hold; the test:

the client stalls between two statements of a transaction (its thread waits for the
interpreter lock while others run, or is descheduled)
  - the server has received none of them: no lock, no row lock, no snapshot is held over
    the client's time; the block still runs whole, and commits, when it ends
    (test_a_transaction_holds_no_lock_while_its_client_stalls)
  - the serial queue's admit: the key's lock is not taken before the whole admit is sent
    (test_a_serial_admit_takes_its_keys_lock_only_once_the_commit_is_sent)
  - inside the caller's transaction (``pipelined`` under ``atomic()``): its BEGIN and its
    statements go together too (test_inside_atomic_the_block_is_sent_at_its_end)
a result is read inside the block (each read waits for the statements before it)
  - what was held is sent first, so the read returns, and later statements still run
    (test_a_read_inside_the_block_sends_what_was_held)
  - a nested pipeline (psycopg syncs the outer one) (test_a_nested_pipeline_inside_the_block)
  - ``executemany`` (test_executemany_inside_the_block)
a long block (an ``executemany`` of many rows)
  - it is not held whole (every row would wait in memory): past ``HOLD_COMMANDS``
    statements it is sent as psycopg sends, and still commits whole
    (test_a_long_block_is_sent_as_it_goes)
the block fails
  - a Python error before its end: nothing was sent, nothing stays, the connection serves
    the next statement (test_a_python_error_in_the_block_sends_nothing_that_stays)
  - a statement fails on the server: its error at the block's end, nothing stays, the
    connection serves the next statement
    (test_a_failed_statement_rolls_back_the_block)
"""

from __future__ import annotations

import collections
import time

import psycopg
import psycopg._pipeline_base
import pytest
from django.db import DatabaseError, connection, transaction
from psycopg import pq

from queueing import locks, sql
from queueing.serial import SerialQueue
from tests.queueing.models import Item

pytestmark = pytest.mark.django_db(transaction=True)

#: Long enough that a statement the client had sent would have run on the server.
STALL = 0.3
KEY = 913_227
QUEUE = SerialQueue(model=Item, namespace=locks.namespace("test_held_pipeline"), key_field="owner")


def _session() -> psycopg.Connection:
    """A psycopg connection of its own, autocommit, as the framework's are."""
    return psycopg.connect(**connection.get_connection_params(), autocommit=True)


@pytest.fixture
def raw():
    with _session() as conn:
        yield conn


@pytest.fixture
def other():
    """A second session, to look at what the first one holds."""
    with _session() as conn:
        yield conn


def _lock_is_free(conn: psycopg.Connection, key: int) -> bool:
    """Whether ``key``'s advisory lock is free now (taken and given back at once)."""
    with conn.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", (key,))
        free = cursor.fetchone()[0]
        if free:
            cursor.execute("SELECT pg_advisory_unlock(%s)", (key,))
    return free


def test_a_transaction_holds_no_lock_while_its_client_stalls(raw, other):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    with sql.committed(raw):
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (KEY,))
        raw.execute("INSERT INTO held_rows VALUES (1)")
        time.sleep(STALL)  # the client stalls mid-transaction
        assert raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
        assert _lock_is_free(other, KEY)
        raw.execute("INSERT INTO held_rows VALUES (2)")
    assert raw.execute("SELECT array_agg(n ORDER BY n) FROM held_rows").fetchone()[0] == [1, 2]
    assert _lock_is_free(other, KEY)


def test_a_serial_admit_takes_its_keys_lock_only_once_the_commit_is_sent(other, monkeypatch):
    key = "held-admit"
    statement, lock_params = locks.xact_lock_statement(QUEUE.namespace, key)
    try_statement = statement.replace("pg_advisory_xact_lock", "pg_try_advisory_xact_lock")
    seen: list[bool] = []
    real = psycopg.Cursor.execute

    def stalling(self, query, params=None, **kwargs):
        if query == "COMMIT":
            # Every statement of the admit is executed, its COMMIT is about to be: the
            # client stalls here, and the key's lock must still be free on the server.
            time.sleep(STALL)
            seen.append(other.execute(try_statement, lock_params).fetchone()[0])
        return real(self, query, params, **kwargs)

    monkeypatch.setattr(psycopg.Cursor, "execute", stalling)
    admitted = QUEUE.admit(key=key, values={"label": "first"})
    monkeypatch.undo()
    assert admitted.status == "pending"
    assert seen == [True]
    assert list(Item.objects.filter(owner=key).values_list("label", flat=True)) == ["first"]


def test_inside_atomic_the_block_is_sent_at_its_end(other):
    with transaction.atomic():
        with sql.pipelined(connection):
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [KEY])
            time.sleep(STALL)
            assert _lock_is_free(other, KEY)
        # The block ended: BEGIN and the lock were sent, and the transaction holds it.
        assert not _lock_is_free(other, KEY)
    assert _lock_is_free(other, KEY)


def test_a_read_inside_the_block_sends_what_was_held(raw):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    with sql.committed(raw):
        raw.execute("INSERT INTO held_rows VALUES (1)")
        cursor = raw.execute("SELECT count(*) FROM held_rows")
        assert cursor.fetchone()[0] == 1
        raw.execute("INSERT INTO held_rows VALUES (2)")
        assert raw.execute("SELECT count(*) FROM held_rows").fetchone()[0] == 2
    assert raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert raw.execute("SELECT count(*) FROM held_rows").fetchone()[0] == 2


def test_a_nested_pipeline_inside_the_block(raw):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    with sql.committed(raw):
        raw.execute("INSERT INTO held_rows VALUES (1)")
        with raw.pipeline():
            raw.execute("INSERT INTO held_rows VALUES (2)")
        raw.execute("INSERT INTO held_rows VALUES (3)")
    assert raw.execute("SELECT array_agg(n ORDER BY n) FROM held_rows").fetchone()[0] == [1, 2, 3]


def test_executemany_inside_the_block(raw):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    with sql.committed(raw), raw.cursor() as cursor:
        cursor.executemany("INSERT INTO held_rows VALUES (%s)", [(n,) for n in range(5)])
        cursor.execute("INSERT INTO held_rows VALUES (5)")
    assert raw.execute("SELECT count(*) FROM held_rows").fetchone()[0] == 6


def test_a_python_error_in_the_block_sends_nothing_that_stays(raw, other):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    with pytest.raises(ValueError), sql.committed(raw):
        raw.execute("SELECT pg_advisory_xact_lock(%s)", (KEY,))
        raw.execute("INSERT INTO held_rows VALUES (1)")
        raise ValueError("the caller changed its mind")
    assert raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert raw.execute("SELECT count(*) FROM held_rows").fetchone()[0] == 0
    assert _lock_is_free(other, KEY)


def test_a_failed_statement_rolls_back_the_block(raw):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    with pytest.raises(psycopg.errors.DivisionByZero), sql.committed(raw):
        raw.execute("INSERT INTO held_rows VALUES (1)")
        raw.execute("SELECT 1 / 0")
        raw.execute("INSERT INTO held_rows VALUES (2)")
    assert raw.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert raw.execute("SELECT count(*) FROM held_rows").fetchone()[0] == 0
    with pytest.raises(DatabaseError), sql.pipelined(connection), connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")
    assert connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE


def test_a_long_block_is_sent_as_it_goes(raw, other):
    with raw.cursor() as cursor:
        cursor.execute("CREATE TEMPORARY TABLE held_rows (n int)")
    rows = sql.HOLD_COMMANDS * 3
    with sql.committed(raw), raw.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (KEY,))
        cursor.executemany("INSERT INTO held_rows VALUES (%s)", [(n,) for n in range(rows)])
        time.sleep(STALL)
        # Sent as it went: the lock before the rows is the server's already.
        assert not _lock_is_free(other, KEY)
    assert raw.execute("SELECT count(*) FROM held_rows").fetchone()[0] == rows
    assert _lock_is_free(other, KEY)


class _InterruptedQueue(collections.deque):
    """A pipeline's command queue whose ``fire_at``-th removal raises KeyboardInterrupt
    after removing its command, as a signal handler's exception does between the drain's
    ``popleft()`` and the call of what it returned."""

    fire_at = 0

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.removed = 0

    def popleft(self):
        command = super().popleft()
        self.removed += 1
        if self.removed == self.fire_at:
            raise KeyboardInterrupt
        return command


@pytest.mark.parametrize("fire_at", [1, 2, 4, 5], ids=["BEGIN", "first", "last", "COMMIT"])
def test_a_signal_in_the_drain_commits_nothing(other, monkeypatch, fire_at):
    """Lost between its removal and its call, a statement must not leave the rest of the
    transaction to commit without it: BEGIN lost would make the rest an implicit
    transaction that the pipeline's Sync commits."""
    other.execute("CREATE TABLE held_interrupted (n int)")
    original = psycopg._pipeline_base.BasePipeline.__init__

    def init(self, conn, *args, **kwargs):
        original(self, conn, *args, **kwargs)
        self.command_queue = _InterruptedQueue()

    _InterruptedQueue.fire_at = fire_at
    try:
        with _session() as conn:
            monkeypatch.setattr(psycopg._pipeline_base.BasePipeline, "__init__", init)
            with pytest.raises(KeyboardInterrupt), sql.committed(conn):
                for n in range(3):  # BEGIN, three INSERTs, COMMIT
                    conn.execute("INSERT INTO held_interrupted VALUES (%s)", (n,))
            monkeypatch.undo()
            assert conn.closed
        assert other.execute("SELECT count(*) FROM held_interrupted").fetchone()[0] == 0
    finally:
        other.execute("DROP TABLE held_interrupted")
