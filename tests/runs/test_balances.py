"""Each user's balance row follows their ledger, whoever writes it.

The admission reads ``credit_balances`` (one row) instead of summing the ledger; the
ledger's triggers keep the row (migration ``runs.0009``). Real statements, real
transactions: the ORM, raw SQL as a release before the row would write it, updates,
deletes, rollbacks, TRUNCATE, and the migration's backfill of a ledger written before it.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.db.migrations.executor import MigrationExecutor

from runs.credits import credit_grant
from runs.models import CreditBalance, CreditEntry, CreditKind
from runs.selectors import credit_balance
from tests.factories import UserFactory
from tests.invariants import violations

BALANCE_INVARIANT = "5d. each user's balance row is the sum of their ledger"


def _rows() -> dict[int, int]:
    return dict(CreditBalance.objects.values_list("user_id", "balance"))


def _raw_grant(user_id: int, amount: int) -> None:
    """A grant as raw SQL (a release that knows nothing of the balance row)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at)"
            " VALUES (%s, 'grant', %s, '', now())",
            [user_id, amount],
        )


@pytest.mark.django_db
def test_inserts_updates_and_deletes_move_the_balance_row():
    alice, bob = UserFactory(), UserFactory()
    assert credit_balance(user_id=alice.pk) == 0 and _rows() == {}
    assert credit_grant(user_id=alice.pk, amount=5) == 5
    _raw_grant(alice.pk, 7)
    _raw_grant(bob.pk, 2)
    assert _rows() == {alice.pk: 12, bob.pk: 2}
    entry = CreditEntry.objects.filter(user=alice, amount=7).get()
    CreditEntry.objects.filter(pk=entry.pk).update(amount=9)
    assert _rows() == {alice.pk: 14, bob.pk: 2}
    CreditEntry.objects.filter(pk=entry.pk).update(user=bob)
    assert _rows() == {alice.pk: 5, bob.pk: 11}
    CreditEntry.objects.filter(pk=entry.pk).delete()
    assert _rows() == {alice.pk: 5, bob.pk: 2}
    assert credit_balance(user_id=bob.pk) == 2
    assert violations().get(BALANCE_INVARIANT) is None


@pytest.mark.django_db
def test_a_rolled_back_entry_leaves_the_balance_row_as_it_was():
    alice = UserFactory()
    credit_grant(user_id=alice.pk, amount=3)
    with pytest.raises(RuntimeError), transaction.atomic():
        _raw_grant(alice.pk, 100)
        assert credit_balance(user_id=alice.pk) == 103
        raise RuntimeError("rolled back")
    assert _rows() == {alice.pk: 3}


@pytest.mark.django_db(transaction=True)
def test_truncating_the_ledger_empties_the_balances():
    alice = UserFactory()
    credit_grant(user_id=alice.pk, amount=3)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE credit_ledger")
    assert _rows() == {}


@pytest.mark.django_db(transaction=True)
def test_the_migration_backfills_the_balances_of_a_ledger_written_before_it():
    alice, bob = UserFactory(), UserFactory()
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0008_core_runs_unfinished_idx")])
    try:
        for user, amount in [(alice, 4), (alice, 6), (bob, 1)]:
            _raw_grant(user.pk, amount)
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at)"
                " SELECT %s, 'grant', 1, '', now() FROM generate_series(1, 500)",
                [bob.pk],
            )
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert _rows() == {alice.pk: 10, bob.pk: 501}
    _raw_grant(alice.pk, 1)
    assert _rows() == {alice.pk: 11, bob.pk: 501}
    assert violations().get(BALANCE_INVARIANT) is None


@pytest.mark.django_db
def test_the_balance_row_refuses_a_sum_past_64_bits():
    """The row is a bigint: an entry that would carry it past 2**63 - 1 fails (and the
    grant that tried writes nothing), where a sum over the ledger silently grew past it."""
    from django.db import DataError

    alice = UserFactory()
    credit_grant(user_id=alice.pk, amount=2**63 - 1)
    with pytest.raises(DataError), transaction.atomic():
        _raw_grant(alice.pk, 1)
    assert _rows() == {alice.pk: 2**63 - 1}
    assert CreditEntry.objects.filter(user=alice, kind=CreditKind.GRANT).count() == 1


@pytest.mark.django_db
def test_a_user_deleted_by_sql_takes_their_balance_row_along():
    """The row is derived data: deleting a user's ledger and then the user in SQL (as a
    purge does) is not refused for the balance row's sake."""
    alice = UserFactory()
    credit_grant(user_id=alice.pk, amount=3)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM credit_ledger WHERE user_id = %s", [alice.pk])
        cursor.execute("DELETE FROM users WHERE id = %s", [alice.pk])
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    assert _rows() == {}
