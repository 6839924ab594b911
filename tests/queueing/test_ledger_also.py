"""``Ledger.claim(also=...)``: statements that follow the claim in its round trip.

Fault model: what the work reads only once it holds the claim (a tenant's catalog that a
replay may have changed) travels with the claim instead of a round trip of its own; so
- it must still run after the claim, on a snapshot that sees what the claim saw:
  test_what_also_sends_runs_after_the_claim_and_is_read_after_it;
- one round trip for both: test_the_claim_and_what_also_sends_are_one_round_trip;
- its statement fails (outside a transaction the claim and it are one transaction of
  their own, BEGIN and COMMIT in the same round trip): the claim is rolled back with it
  and the error raised: test_a_failing_statement_of_also_rolls_the_claim_back;
- it raises in Python: the error propagates, the claim is rolled back and nothing is
  left half-read on the connection (its next statement works):
  test_a_python_error_in_also_propagates;
- what it wrote breaks a deferred constraint, checked at the COMMIT: an
  ``IntegrityError``, the claim rolled back, the connection clean
  (test_a_deferred_constraint_that_fails_at_the_commit_rolls_the_claim_back);
- inside the caller's transaction: its BEGIN rides with the claim and both are the
  caller's to commit: test_inside_a_transaction_the_claim_and_also_are_the_callers;
- a claim that is done or busy still hands back what also read;
- the claim's prepared plan went stale (a migration widened a column it returns; a
  pooler's DISCARD ALL): the pipeline is sent again, once, ``also`` with it
  (test_a_claim_whose_prepared_plan_went_stale_is_sent_again_with_also; before the fix
  every such claim on that connection failed until the connection was replaced).
"""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from psycopg import pq

from queueing import sql
from queueing.ledger import Ledger, Outcome
from tests.queueing.models import Step
from tests.queueing.test_round_trips import round_trips

LEDGER = Ledger(model=Step, key_fields=("unit", "stage"), lease_seconds=60)

pytestmark = pytest.mark.django_db(transaction=True)

#: What the claim wrote, as a statement after it sees it.
SEEN = "SELECT status, attempts FROM test_steps WHERE unit = %(unit)s AND stage = %(stage)s"


class Read:
    """A statement sent by ``also``, read after the claim returns."""

    def __init__(self, query: str, params: dict):
        self.query, self.params, self.cursor = query, params, None

    def send(self) -> None:
        self.cursor = sql.statement_cursor(connection)
        self.cursor.execute(self.query, self.params)

    def rows(self) -> list[tuple]:
        with self.cursor:
            return self.cursor.fetchall()


def test_what_also_sends_runs_after_the_claim_and_is_read_after_it():
    read = Read(SEEN, {"unit": "a1", "stage": "s"})
    claim = LEDGER.claim(unit="a1", stage="s", also=read.send)
    assert claim.outcome is Outcome.CLAIMED and claim.token == 1
    assert read.rows() == [("running", 1)]
    # Done and busy claims hand back what also read, too.
    LEDGER.complete(claim)
    again = Read(SEEN, {"unit": "a1", "stage": "s"})
    assert LEDGER.claim(unit="a1", stage="s", also=again.send).outcome is Outcome.DONE
    assert again.rows() == [("success", 1)]
    LEDGER.claim(unit="a2", stage="s")
    busy = Read(SEEN, {"unit": "a2", "stage": "s"})
    assert LEDGER.claim(unit="a2", stage="s", also=busy.send).outcome is Outcome.BUSY
    assert busy.rows() == [("running", 1)]


def test_the_claim_and_what_also_sends_are_one_round_trip():
    read = Read("SELECT 1", {})
    claim, spent = round_trips(lambda: LEDGER.claim(unit="b1", stage="s", also=read.send))
    assert claim.outcome is Outcome.CLAIMED and spent == 1
    assert read.rows() == [(1,)]
    plain, spent_alone = round_trips(lambda: LEDGER.claim(unit="b2", stage="s"))
    assert plain.outcome is Outcome.CLAIMED and spent_alone == 1


def test_a_failing_statement_of_also_rolls_the_claim_back():
    read = Read("SELECT 1 / %(zero)s", {"zero": 0})
    with pytest.raises(DatabaseError, match="division by zero"):
        LEDGER.claim(unit="c1", stage="s", also=read.send)
    assert not Step.objects.filter(unit="c1").exists()
    read.cursor.close()
    # The connection is clean: the next claim takes the stage.
    assert LEDGER.claim(unit="c1", stage="s").outcome is Outcome.CLAIMED


def test_a_python_error_in_also_propagates():
    def broken() -> None:
        raise RuntimeError("not sent")

    with pytest.raises(RuntimeError, match="not sent"):
        LEDGER.claim(unit="d1", stage="s", also=broken)
    # The claim was sent before the error, in a transaction of its own that never got its
    # COMMIT: rolled back, and nothing is left unread on the connection.
    with connection.cursor() as cursor:
        cursor.execute("SELECT 2")
        assert cursor.fetchone() == (2,)
    assert not Step.objects.filter(unit="d1").exists()
    assert LEDGER.claim(unit="d1", stage="s").outcome is Outcome.CLAIMED


def test_a_deferred_constraint_that_fails_at_the_commit_rolls_the_claim_back():
    """What ``also`` wrote breaks a deferred constraint (Django's foreign keys are checked
    at the COMMIT: a row referring to one deleted meanwhile): the COMMIT fails, as an
    ``IntegrityError``, the claim is rolled back with it, and the connection serves the
    next claim."""
    from django.db import IntegrityError

    def orphan() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO test_items (owner, status, parent_id, created_at, updated_at, label)"
                " VALUES ('g', 'pending', -1, now(), now(), '')"
            )

    with pytest.raises(IntegrityError, match="foreign key"):
        LEDGER.claim(unit="g1", stage="s", also=orphan)
    assert not Step.objects.filter(unit="g1").exists()
    assert connection.connection.pgconn.transaction_status == pq.TransactionStatus.IDLE
    assert LEDGER.claim(unit="g1", stage="s").outcome is Outcome.CLAIMED


def test_inside_a_transaction_the_claim_and_also_are_the_callers():
    read = Read(SEEN, {"unit": "e1", "stage": "s"})
    with pytest.raises(RuntimeError, match="rolled back"), transaction.atomic():
        claim = LEDGER.claim(unit="e1", stage="s", also=read.send)
        assert claim.outcome is Outcome.CLAIMED and read.rows() == [("running", 1)]
        raise RuntimeError("rolled back")
    assert not Step.objects.filter(unit="e1").exists()
    with transaction.atomic():
        committed = Read(SEEN, {"unit": "e2", "stage": "s"})
        assert LEDGER.claim(unit="e2", stage="s", also=committed.send).claimed
        assert committed.rows() == [("running", 1)]
    assert Step.objects.get(unit="e2").status == "running"


def test_a_claim_whose_prepared_plan_went_stale_is_sent_again_with_also():
    """A migration widens a column the claim returns while the connection holds the
    claim prepared: the refused pipeline (nothing ran) is sent again, once, what ``also``
    sends with it, and the claim is taken — as a lone claim's cursor runs it again."""
    import psycopg
    from procrastinate.contrib.django.utils import connector_params

    connection.ensure_connection()
    if not sql.prepares(connection):
        pytest.skip("the connection prepares nothing (a pooler's settings)")

    def ddl(statement: str) -> None:
        with psycopg.connect(**connector_params(), autocommit=True) as other:
            other.execute(statement)

    first = Read(SEEN, {"unit": "f1", "stage": "s"})
    assert LEDGER.claim(unit="f1", stage="s", also=first.send).claimed
    first.rows()
    ddl("ALTER TABLE test_steps ALTER COLUMN attempts TYPE bigint")
    try:
        sends = []

        def send() -> None:
            sends.append(1)
            again.send()

        again = Read(SEEN, {"unit": "f2", "stage": "s"})
        claim = LEDGER.claim(unit="f2", stage="s", also=send)
        assert claim.claimed and again.rows() == [("running", 1)]
        assert len(sends) == 2  # refused once, sent again
    finally:
        connection.close()
        ddl("ALTER TABLE test_steps ALTER COLUMN attempts TYPE integer")
