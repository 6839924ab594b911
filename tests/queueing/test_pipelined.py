"""One round trip where the statements allow it (``queueing.sql.pipelined``, the statement
cursor, ``Ledger.complete(hold=..., write=...)``), counted on the wire.

Fault model — what a pipelined round trip can meet; what must hold; the test:

the BEGIN a statement opens ``atomic()`` with
  - it travels with the statement, and the transaction is the caller's: not visible
    before the COMMIT, gone on a rollback
    (test_the_statement_that_opens_a_transaction_brings_its_begin)
  - with Django's default (nothing prepared, bound on the client) too
    (test_with_djangos_default_binding_the_begin_rides_too)
  - a serial queue's admit inside the caller's not yet begun transaction too
    (test_a_serial_admit_that_opens_the_callers_transaction_brings_its_begin)
  - Django's execute wrappers and query log see that round trip, its error and its time
    (test_on_djangos_default_binding_execute_wrappers_see_the_round_trip)
  - an advisory lock that opens the transaction brings it too
    (test_a_lock_that_opens_a_transaction_brings_its_begin)
  - the connection's isolation level is the transaction's
    (test_the_begin_it_brings_keeps_the_connections_isolation_level)
  - psycopg is left as it was: statements after it (Django's own too) run in the same
    transaction, and the next ``atomic()`` opens its own
    (test_after_the_first_statement_the_transaction_goes_on_as_ever)
  - the statement fails: the transaction is failed as after any failed statement, and
    the connection serves the next one (test_a_failed_first_statement_fails_the_transaction_only)
the closing transaction (``complete(hold=..., write=...)``)
  - BEGIN, the hold, the writes and the completion: one round trip, then the COMMIT
    (test_a_closing_transaction_is_one_round_trip_and_its_commit), also where nothing is
    prepared (a transaction pooler) (test_without_prepared_statements_too)
  - the prerequisite changed: ``PrerequisiteChanged``, nothing the writes sent stays, the
    row stays claimable (test_a_changed_prerequisite_rolls_back_what_was_sent_with_it)
  - it changed and a write failed on it: the hold's verdict is what the caller sees
    (test_the_holds_verdict_comes_before_a_later_statements_error)
  - it changed and the write raised in Python: the hold's verdict still
    (test_the_holds_verdict_comes_before_a_python_error_in_the_write)
  - the caller catches the error inside its ``atomic()``: nothing sent commits, and a
    statement after it is refused (test_a_caught_check_failure_commits_nothing)
  - a write fails: its database error, nothing stays, the row stays claimable
    (test_a_failed_write_rolls_back_and_leaves_the_row_claimable)
  - the token is stale: ``LeaseLost``, nothing stays, no next job
    (test_a_stale_token_rolls_back_the_writes_and_enqueues_nothing)
  - outside a transaction: refused before anything is sent
    (test_a_closing_transaction_outside_atomic_is_refused)
"""

from __future__ import annotations

import time

import psycopg
import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.db.transaction import TransactionManagementError

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing import locks, sql
from queueing.enqueue import Policy, enqueue, job_params
from queueing.exceptions import LeaseLost, PrerequisiteChanged
from queueing.ledger import Ledger, Prerequisite
from tests.conftest import jobs
from tests.queueing.models import Step
from tests.queueing.test_round_trips import round_trips

LEDGER = Ledger(model=Step, key_fields=("unit", "stage"), lease_seconds=60)
LOCKS = locks.namespace("test_pipelined_lock")
SERIAL_LOCKS = locks.namespace("test_pipelined_serial")

pytestmark = pytest.mark.django_db(transaction=True)


def _other_sees_job(job_id: int, params: dict | None = None) -> bool:
    """Whether a session of its own (not through the wire counter) sees the job."""
    params = params or connection.get_connection_params()
    with psycopg.connect(**params, autocommit=True) as other:
        return other.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE id = %s", [job_id]
        ).fetchone() == (1,)


def test_the_statement_that_opens_a_transaction_brings_its_begin(clean_queue):
    direct = connection.get_connection_params()

    def enqueue_in_atomic():
        with transaction.atomic():
            job = enqueue("tests.record", args={"label": "a"}, key="pl:a", policy=Policy.EXCLUSIVE)
            assert (
                connection.connection.info.transaction_status
                == psycopg.pq.TransactionStatus.INTRANS
            )
            assert not _other_sees_job(job.job_id, direct)
        return job

    job, n = round_trips(enqueue_in_atomic)
    assert n == 2  # BEGIN with the INSERT; COMMIT
    assert _other_sees_job(job.job_id)

    class Undo(Exception):
        pass

    with pytest.raises(Undo), transaction.atomic():
        enqueue("tests.record", args={"label": "b"}, key="pl:b", policy=Policy.EXCLUSIVE)
        raise Undo
    assert [j["queueing_lock"] for j in jobs()] == ["exclusive/pl:a"]


def test_with_djangos_default_binding_the_begin_rides_too(clean_queue, settings, monkeypatch):
    """A database whose OPTIONS prepare nothing (Django's default; a transaction pooler):
    the statement is Django's own (bound on the client), and still brings its BEGIN."""
    monkeypatch.setitem(settings.DATABASES["default"]["OPTIONS"], "prepare_threshold", None)
    connections["default"].close()
    direct = connection.get_connection_params()

    def enqueue_in_atomic():
        assert not sql.prepares(connection)
        with transaction.atomic():
            job = enqueue("tests.record", args={"label": "e"}, key="pl:e", policy=Policy.EXCLUSIVE)
            assert not _other_sees_job(job.job_id, direct)
        return job

    job, n = round_trips(enqueue_in_atomic)
    assert n == 2
    assert _other_sees_job(job.job_id)
    with (
        pytest.raises(DatabaseError, match="division by zero"),
        transaction.atomic(),
        sql.statement_cursor(connection) as cursor,
    ):
        cursor.execute("SELECT 1 / %s", [0])
    connections["default"].close()


def test_a_serial_admit_that_opens_the_callers_transaction_brings_its_begin(clean_queue):
    from queueing.serial import SerialQueue, StartJob
    from tests.queueing.models import Item

    queue = SerialQueue(
        model=Item,
        namespace=SERIAL_LOCKS,
        key_field="owner",
        parent_field="parent",
        deleted_field="deleted_at",
    )
    job = StartJob(task="tests.record", id_arg="item", args={"label": "s"})

    def admit_in_atomic():
        with transaction.atomic():
            return queue.admit(key="pl-owner", values={"label": "s"}, start_job=job)

    admitted, n = round_trips(admit_in_atomic)
    assert (admitted.status, n) == ("pending", 2)  # BEGIN, lock, statement; COMMIT
    assert len(jobs()) == 1


def test_on_djangos_default_binding_execute_wrappers_see_the_round_trip(settings, monkeypatch):
    """Django's execute wrappers (error reporting, tracing) and its query log see the
    statement that brings the BEGIN as any other: its error, and its time on the server."""
    monkeypatch.setitem(settings.DATABASES["default"]["OPTIONS"], "prepare_threshold", None)
    connections["default"].close()
    seen: list[tuple[str, float]] = []

    def wrapper(execute, sql_text, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql_text, params, many, context)
        except Exception as exc:
            seen.append((type(exc).__name__, time.perf_counter() - started))
            raise
        finally:
            if not seen or seen[-1][0] == "ok":
                seen.append(("ok", time.perf_counter() - started))

    with connection.execute_wrapper(wrapper):
        with transaction.atomic(), sql.statement_cursor(connection) as cursor:
            cursor.execute("SELECT pg_sleep(%s)", [0.2])
        with (
            pytest.raises(DatabaseError),
            transaction.atomic(),
            sql.statement_cursor(connection) as cursor,
        ):
            cursor.execute("SELECT 1 / %s", [0])
    assert seen[0][0] == "ok" and seen[0][1] >= 0.2
    assert seen[1][0] == "DataError"
    cursor = sql.statement_cursor(connection)
    connection.close()
    with pytest.raises(DatabaseError), transaction.atomic():
        cursor.execute("SELECT 1")
    connections["default"].close()


def test_a_lock_that_opens_a_transaction_brings_its_begin():
    namespace = LOCKS

    def lock_in_atomic():
        with transaction.atomic():
            locks.xact_lock(namespace, 1)
            assert locks.try_xact_lock(namespace, 1)  # held by this transaction
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT count(*) FROM pg_locks "
                    "WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
                )
                return cursor.fetchone()[0]

    held, n = round_trips(lock_in_atomic)
    assert held == 1 and n == 4  # BEGIN with the lock; the try; the count; COMMIT


def test_the_begin_it_brings_keeps_the_connections_isolation_level():
    connection.ensure_connection()
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.SERIALIZABLE
    raw.read_only = True
    try:
        with transaction.atomic(), sql.statement_cursor(connection) as cursor:
            cursor.execute(
                "SELECT current_setting('transaction_isolation'), "
                "current_setting('transaction_read_only')"
            )
            assert cursor.fetchone() == ("serializable", "on")
    finally:
        raw.isolation_level = None
        raw.read_only = None


def test_after_the_first_statement_the_transaction_goes_on_as_ever(clean_queue):
    with transaction.atomic():
        enqueue("tests.record", args={"label": "c"}, key="pl:c", policy=Policy.EXCLUSIVE)
        assert not connection.connection.autocommit
        with connection.cursor() as cursor:
            cursor.execute("SELECT txid_current_if_assigned() IS NOT NULL")
            assert cursor.fetchone() == (True,)  # the INSERT's transaction, still open
        Step.objects.create(unit="pl", stage="c", status="running")
    assert Step.objects.filter(unit="pl").count() == 1
    with transaction.atomic():
        enqueue("tests.record", args={"label": "d"}, key="pl:d", policy=Policy.EXCLUSIVE)
    assert len(jobs()) == 2
    assert connection.connection.autocommit  # Django's autocommit again, between blocks


def test_a_failed_first_statement_fails_the_transaction_only():
    with (
        pytest.raises(DatabaseError),
        transaction.atomic(),
        sql.statement_cursor(connection) as cursor,
    ):
        cursor.execute("SELECT 1 / (%(zero)s::int)", {"zero": 0})
    with transaction.atomic(), sql.statement_cursor(connection) as cursor:
        cursor.execute("SELECT 2")
        assert cursor.fetchone() == (2,)
    assert connection.connection.autocommit  # Django autocommits again after the block


def _done(unit: str) -> Prerequisite:
    claim = LEDGER.claim(unit=unit, stage="before")
    LEDGER.complete(claim)
    return Prerequisite(key={"unit": unit, "stage": "before"}, token=claim.token)


def _write(unit: str, *, fail: bool = False):
    """What a stage writes: a row of its own (and, failing, a statement the server refuses)."""

    def write() -> None:
        cursor = sql.statement_cursor(connection)
        cursor.execute(
            "INSERT INTO test_steps (unit, stage, status, attempts, input_hash, error) "
            "VALUES (%(unit)s, 'written', 'success', 0, '', '')",
            {"unit": unit},
        )
        if fail:
            cursor.execute("SELECT 1 / (%(zero)s::int)", {"zero": 0})

    return write


def _next(unit: str) -> dict:
    return job_params(
        "tests.record", args={"label": unit}, key=f"pl-next:{unit}", policy=Policy.EXCLUSIVE
    )


def _close(unit: str, prerequisite: Prerequisite, claim, *, fail: bool = False) -> None:
    with transaction.atomic():
        LEDGER.complete(claim, hold=prerequisite, write=_write(unit, fail=fail), then=_next(unit))


def _state(unit: str) -> tuple[str, bool, list]:
    status = Step.objects.get(unit=unit, stage="after").status
    written = Step.objects.filter(unit=unit, stage="written").exists()
    return status, written, [j["queueing_lock"] for j in jobs()]


def test_a_closing_transaction_is_one_round_trip_and_its_commit(clean_queue):
    before = _done("c1")
    claim = LEDGER.claim(unit="c1", stage="after")
    _, n = round_trips(lambda: _close("c1", before, claim))
    assert n == 2  # BEGIN, hold, write, complete + next job; COMMIT
    assert _state("c1") == ("success", True, ["exclusive/pl-next:c1"])


def test_without_prepared_statements_too(clean_queue, settings, monkeypatch):
    monkeypatch.setitem(settings.DATABASES["default"]["OPTIONS"], "prepare_threshold", None)
    connections["default"].close()
    before = _done("c2")
    claim = LEDGER.claim(unit="c2", stage="after")
    _, n = round_trips(lambda: _close("c2", before, claim))
    assert n == 2
    assert _state("c2") == ("success", True, ["exclusive/pl-next:c2"])
    changed = Prerequisite(key=before.key, token=before.token + 1)
    again = LEDGER.claim(unit="c2b", stage="after")
    with pytest.raises(PrerequisiteChanged):
        _close("c2b", changed, again, fail=True)
    connections["default"].close()


def test_a_changed_prerequisite_rolls_back_what_was_sent_with_it(clean_queue):
    before = _done("c3")
    claim = LEDGER.claim(unit="c3", stage="after")
    Step.objects.filter(unit="c3", stage="before").update(status="failed")
    with pytest.raises(PrerequisiteChanged) as raised:
        _close("c3", before, claim)
    assert raised.value.status == "failed"
    assert _state("c3") == ("running", False, [])
    assert LEDGER.claim(unit="c3", stage="after").outcome == "busy"  # still its lease


def test_the_holds_verdict_comes_before_a_later_statements_error(clean_queue):
    before = _done("c4")
    claim = LEDGER.claim(unit="c4", stage="after")
    stale = Prerequisite(key=before.key, token=before.token + 1)
    with pytest.raises(PrerequisiteChanged) as raised:
        _close("c4", stale, claim, fail=True)
    assert (raised.value.status, raised.value.token) == ("success", before.token)
    assert _state("c4") == ("running", False, [])


def test_a_failed_write_rolls_back_and_leaves_the_row_claimable(clean_queue):
    before = _done("c5")
    claim = LEDGER.claim(unit="c5", stage="after")
    with pytest.raises(DatabaseError, match="division by zero"):
        _close("c5", before, claim, fail=True)
    assert _state("c5") == ("running", False, [])
    LEDGER.fail(claim, error="x")
    assert LEDGER.claim(unit="c5", stage="after").claimed


def test_a_stale_token_rolls_back_the_writes_and_enqueues_nothing(clean_queue):
    before = _done("c6")
    claim = LEDGER.claim(unit="c6", stage="after")
    Step.objects.filter(unit="c6", stage="after").update(attempts=claim.token + 1)
    with pytest.raises(LeaseLost):
        _close("c6", before, claim)
    assert _state("c6") == ("running", False, [])


def test_a_closing_transaction_outside_atomic_is_refused(clean_queue):
    before = _done("c7")
    claim = LEDGER.claim(unit="c7", stage="after")
    with pytest.raises(TransactionManagementError):
        LEDGER.complete(claim, hold=before, write=_write("c7"))
    assert _state("c7") == ("running", False, [])


def test_the_holds_verdict_comes_before_a_python_error_in_the_write(clean_queue):
    before = _done("c8")
    claim = LEDGER.claim(unit="c8", stage="after")
    stale = Prerequisite(key=before.key, token=before.token + 1)

    def write() -> None:
        _write("c8")()
        raise ValueError("a bug in building the results")

    with pytest.raises(PrerequisiteChanged), transaction.atomic():
        LEDGER.complete(claim, hold=stale, write=write, then=_next("c8"))
    assert _state("c8") == ("running", False, [])


def test_a_caught_check_failure_commits_nothing(clean_queue):
    before = _done("c9")
    claim = LEDGER.claim(unit="c9", stage="after")
    stale = Prerequisite(key=before.key, token=before.token + 1)
    with transaction.atomic():
        try:
            LEDGER.complete(claim, hold=stale, write=_write("c9"), then=_next("c9"))
        except PrerequisiteChanged:
            with pytest.raises(TransactionManagementError):
                LEDGER.fail(claim, error="input changed")
    assert _state("c9") == ("running", False, [])
    LEDGER.fail(claim, error="input changed")  # in a transaction of its own
    assert Step.objects.get(unit="c9", stage="after").status == "failed"
