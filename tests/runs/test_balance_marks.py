"""A user's balance as a mark plus the ledger entries since (``CreditBalanceMark``).

An admission folds the entries of transactions that had all ended (those below its
snapshot's xmin) into the user's mark, and reads the balance as the mark plus the entries
from its horizon on. The guarantee: that reading is the ledger's sum, whatever was in
flight when a fold ran (a grant or refund uncommitted at the fold, a transaction that
took its id before the fold and wrote its entry after it), and a mark of another cluster
(a dump restored elsewhere, whose transaction ids are not this server's) is never read.
Real connections write the entries in flight; ``runs.credits.FOLD_AFTER`` is 1 here
(tests/runs/conftest.py), so every admission that finds a settled entry folds.
"""

from __future__ import annotations

import contextlib
import threading
import time

import psycopg
import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor

from runs import admission
from runs.exceptions import QueueFull
from runs.models import CreditBalanceMark, CreditEntry
from runs.selectors import credit_balance
from tests.conftest import database_url
from tests.invariants import assert_invariants
from tests.runs.factories import DOC_HTML, SOURCES, funded_user

pytestmark = pytest.mark.django_db(transaction=True)


def admit(user):
    return admission.analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)


def ledger_sum(user_id: int) -> int:
    return sum(CreditEntry.objects.filter(user_id=user_id).values_list("amount", flat=True))


def grant_sql(cursor, user_id: int, amount: int = 1) -> None:
    cursor.execute(
        "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at)"
        " VALUES (%s, 'grant', %s, 'in flight', now())",
        [user_id, amount],
    )


def future_mark(cursor, user_id: int, *, balance: int, ahead: int) -> None:
    """A mark of this cluster whose horizon is ``ahead`` ids above its counter (a clone
    given a later dump)."""
    cursor.execute(
        "INSERT INTO credit_balance_marks (user_id, balance, horizon, cluster, entries,"
        " folded_at) SELECT %s, %s,"
        " (pg_snapshot_xmax(pg_current_snapshot())::text::numeric + %s)::text::xid8,"
        " system_identifier, 1, now() FROM pg_control_system()",
        [user_id, balance, ahead],
    )


def mark(user_id: int) -> CreditBalanceMark | None:
    return CreditBalanceMark.objects.filter(user_id=user_id).first()


def settle(timeout: float = 120.0) -> None:
    """Wait until every transaction that had an id now has ended, so that the next
    admission's horizon (its snapshot's xmin, which any open transaction with writes on
    the server holds back: a parallel test worker's, for one) is past the entries written
    so far. Each poll is one statement of its own, in a snapshot of its own."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text")
        (target,) = cursor.fetchone()
        deadline = time.monotonic() + timeout
        while True:
            cursor.execute("SELECT pg_snapshot_xmin(pg_current_snapshot()) >= %s::xid8", [target])
            if cursor.fetchone()[0]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"a transaction below {target} is still open")
            time.sleep(0.02)


def test_an_admission_folds_the_settled_entries_and_leaves_its_own_charge_in_the_tail():
    user = funded_user(credits=3)
    with connection.cursor() as cursor:
        for _ in range(4):
            grant_sql(cursor, user.pk)
    assert mark(user.pk) is None
    settle()

    admit(user)

    folded = mark(user.pk)
    assert folded is not None
    assert (folded.balance, folded.entries) == (7, 5)  # the five grants, not the charge
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 6
    settle()
    admit(user)  # folds the first charge; this one's stays in the tail
    folded = mark(user.pk)
    assert (folded.balance, folded.entries) == (6, 6)
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 5
    assert_invariants()


def test_an_entry_uncommitted_at_the_fold_counts_once_it_commits():
    user = funded_user(credits=2)
    settle()
    with psycopg.connect(database_url()) as other, other.cursor() as cursor:
        grant_sql(cursor, user.pk, amount=7)  # its transaction stays open over the fold
        admit(user)
        folded = mark(user.pk)
        assert folded is not None and folded.entries == 1
        other.commit()

    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 8
    settle()
    admit(user)  # now settled: folded
    assert mark(user.pk).entries == 3
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 7
    assert_invariants()


def test_a_transaction_that_began_before_the_fold_and_wrote_after_it_counts():
    """Its id was taken before the fold (below the fold's horizon? never: it was still
    running, so the horizon is at most its id); its entry is written after the fold."""
    user = funded_user(credits=2)
    settle()
    with psycopg.connect(database_url()) as other, other.cursor() as cursor:
        cursor.execute("SELECT pg_current_xact_id()")
        (xid,) = cursor.fetchone()
        admit(user)
        assert int(str(mark(user.pk).horizon)) <= int(str(xid))
        grant_sql(cursor, user.pk, amount=5)
        other.commit()

    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 6
    assert_invariants()


def test_a_refused_admission_folds_nothing(settings):
    settings.MAX_QUEUED_ANALYSES_PER_USER = 1
    user = funded_user(credits=5)
    settle()
    admit(user)
    before = mark(user.pk)
    assert before is not None
    with connection.cursor() as cursor:
        for _ in range(3):
            grant_sql(cursor, user.pk)

    with pytest.raises(QueueFull):
        admit(user)

    after = mark(user.pk)
    assert (after.balance, after.entries, after.horizon) == (
        before.balance,
        before.entries,
        before.horizon,
    )
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 7


def test_a_mark_of_another_cluster_is_never_read_and_is_replaced():
    """A dump restored into another cluster brings its marks along, with horizons in the
    old cluster's transaction ids: read, they would skip this cluster's entries."""
    user = funded_user(credits=3)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO credit_balance_marks (user_id, balance, horizon, cluster, entries,"
            " folded_at) VALUES (%s, 1000000, '9223372036854775000', 42, 1, now())",
            [user.pk],
        )
    assert credit_balance(user_id=user.pk) == 3
    assert_invariants()  # 5d reads the balance as the admission does: without the mark
    settle()

    admit(user)

    with connection.cursor() as cursor:
        cursor.execute("SELECT system_identifier FROM pg_control_system()")
        (cluster,) = cursor.fetchone()
    replaced = mark(user.pk)
    assert (replaced.cluster, replaced.balance, replaced.entries) == (cluster, 3, 1)
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 2
    assert_invariants()


def test_after_a_fold_the_balance_reads_one_index_range_of_the_entries_since():
    user = funded_user(credits=1)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at)"
            " SELECT %s, 'grant', 1, 'history', now() FROM generate_series(1, 5000)",
            [user.pk],
        )
        cursor.execute("ANALYZE credit_ledger")
    settle()
    admit(user)
    assert mark(user.pk).entries == 5001

    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (ANALYZE, COSTS off, TIMING off, SUMMARY off) "
            "SELECT sum(c.amount) FROM credit_ledger c "
            "WHERE c.user_id = %s AND c.created_xid >= %s::xid8",
            [user.pk, str(mark(user.pk).horizon)],
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "credit_ledger_user_xid_idx" in plan, plan
    assert "rows=1 " in plan, plan  # the charge alone: the tail, not the history
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 5000


def test_grants_committing_while_admissions_fold_are_all_counted():
    """One session holds a grant uncommitted over the whole run, another commits grants
    one by one, a thread admits (each admission folds): afterwards the balance as the
    admission reads it is the ledger's sum, the held grant included."""
    grants, admits = 150, 40
    # Funded for every admission: the admitting thread may outrun the grants.
    user = funded_user(credits=admits)
    errors: list[BaseException] = []

    def granting() -> None:
        try:
            with psycopg.connect(database_url(), autocommit=True) as other:
                for _ in range(grants):
                    grant_sql(other.cursor(), user.pk)
        except BaseException as exc:
            errors.append(exc)

    def admitting() -> None:
        try:
            for _ in range(admits):
                with contextlib.suppress(QueueFull):
                    admit(user)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    with psycopg.connect(database_url()) as held, held.cursor() as cursor:
        grant_sql(cursor, user.pk, amount=1000)
        threads = [threading.Thread(target=granting), threading.Thread(target=admitting)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert credit_balance(user_id=user.pk) == ledger_sum(user.pk)  # without it
        held.commit()

    assert not errors, errors
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) >= 1000
    settle()
    admit(user)  # folds the held grant too
    assert mark(user.pk).balance >= 1000
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk)
    assert_invariants()


def test_the_migration_gives_existing_entries_an_id_every_mark_folds():
    executor = MigrationExecutor(connection)
    executor.migrate([("runs", "0009_drop_credit_balances")])
    try:
        user = funded_user(credits=0)
        with connection.cursor() as cursor:  # written as the previous release writes
            grant_sql(cursor, user.pk, amount=4)
            grant_sql(cursor, user.pk, amount=2)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT created_xid::text FROM credit_ledger WHERE user_id = %s", [user.pk]
        )
        assert cursor.fetchall() == [("1",)]
    settle()

    admit(user)

    assert mark(user.pk).entries == 2
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 5
    assert_invariants()


def test_a_mark_above_this_servers_transaction_counter_is_never_read_and_is_replaced():
    """A clone keeps the cluster's identifier, but its transaction counter may be behind a
    mark that a later dump brought in: read, that mark would hide every entry this
    server writes until its counter caught up."""
    user = funded_user(credits=3)
    with connection.cursor() as cursor:
        future_mark(cursor, user.pk, balance=1000000, ahead=1000000)
    assert credit_balance(user_id=user.pk) == 3
    assert_invariants()
    settle()

    admit(user)

    replaced = mark(user.pk)
    assert (replaced.balance, replaced.entries) == (3, 1)
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 2
    assert_invariants()


def test_an_admission_after_a_grant_in_its_own_transaction_counts_the_grant_once():
    """The grant's transaction is the admission's own, open while it folds: the horizon
    (the snapshot's xmin) is at most its id, and the grant stays in the tail."""
    user = funded_user(credits=1)
    settle()
    with transaction.atomic():
        with connection.cursor() as cursor:
            grant_sql(cursor, user.pk, amount=5)
        admit(user)
        assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 5
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 5
    settle()
    admit(user)
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 4
    assert_invariants()


def test_an_entry_written_with_an_old_transaction_id_gets_its_own():
    """``COPY``, ``pg_restore --data-only`` or a replica's apply may bring a row with an
    id below the mark's horizon: it is stamped with the inserting transaction's, so the
    balance counts it."""
    user = funded_user(credits=1)
    settle()
    admit(user)  # a mark now
    assert mark(user.pk) is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at, created_xid)"
            " VALUES (%s, 'grant', 7, 'restored', now(), '1') RETURNING created_xid::text",
            [user.pk],
        )
        (stamped,) = cursor.fetchone()
    assert stamped != "1"
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 7
    assert_invariants()


def test_the_ledger_is_append_only():
    user = funded_user(credits=2)
    settle()
    admit(user)
    entry = CreditEntry.objects.filter(user=user, kind="grant").get()
    with connection.cursor() as cursor:
        for change in (
            "UPDATE credit_ledger SET amount = 100 WHERE id = %s",
            "UPDATE credit_ledger SET created_xid = '1' WHERE id = %s",
            "DELETE FROM credit_ledger WHERE id = %s",
        ):
            with transaction.atomic(), pytest.raises(IntegrityError, match="append-only") as raised:
                cursor.execute(change, [entry.pk])
            assert isinstance(raised.value.__cause__, psycopg.errors.RestrictViolation)
        # With no mark, an entry's id may become '1' only in a rebase, which holds the
        # ledger's lock (an admission folding meanwhile would leave it out of both).
        cursor.execute("DELETE FROM credit_balance_marks WHERE user_id = %s", [user.pk])
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            cursor.execute("UPDATE credit_ledger SET created_xid = '1' WHERE id = %s", [entry.pk])
        # A note is not what the balance reads: it may be corrected.
        cursor.execute("UPDATE credit_ledger SET note = 'corrected' WHERE id = %s", [entry.pk])
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 1
    # An erase: of an active user, refused even with no mark (an admission could fold
    # the entry while it goes); of a deactivated one, the mark first, then the entries.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM credit_balance_marks WHERE user_id = %s", [user.pk])
        with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
            cursor.execute("DELETE FROM credit_ledger WHERE user_id = %s", [user.pk])
    user.is_active = False
    user.save(update_fields=["is_active"])
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM credit_balance_marks WHERE user_id = %s", [user.pk])
        cursor.execute("DELETE FROM credit_ledger WHERE user_id = %s", [user.pk])
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 0


def test_truncating_the_ledger_empties_the_marks():
    user = funded_user(credits=2)
    settle()
    admit(user)
    assert mark(user.pk) is not None
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE credit_ledger")
    assert mark(user.pk) is None
    assert credit_balance(user_id=user.pk) == 0


def test_rebase_after_a_restore_folds_entries_that_kept_another_clusters_ids(capsys):
    """A restore keeps the entries' old ids (its triggers come after its data): those
    ahead of this server's counter stay in every admission's tail until the rebase
    gives them the id every mark folds."""
    user = funded_user(credits=2)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE credit_ledger DISABLE TRIGGER credit_ledger_stamp")
        try:
            cursor.execute(
                "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at,"
                " created_xid) SELECT %s, 'grant', 1, 'restored', now(),"
                " (pg_snapshot_xmax(pg_current_snapshot())::text::numeric + 1000000)"
                "::text::xid8 FROM generate_series(1, 3)",
                [user.pk],
            )
        finally:
            # As pg_restore --disable-triggers leaves it: an ordinary trigger again.
            cursor.execute("ALTER TABLE credit_ledger ENABLE TRIGGER credit_ledger_stamp")
    settle()
    admit(user)
    assert mark(user.pk).entries == 1  # the funding grant; the restored three stay out
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 4

    call_command("rebase_credit_marks", "--dry-run")
    dry = capsys.readouterr().out
    assert "would be rebased" in dry and "nothing changed" in dry
    assert mark(user.pk) is not None

    call_command("rebase_credit_marks")

    out = capsys.readouterr().out
    assert "entries rebased" in out and "marks dropped" in out
    with connection.cursor() as cursor:  # a replica's apply stamps again
        cursor.execute("SELECT tgenabled FROM pg_trigger WHERE tgname = 'credit_ledger_stamp'")
        assert cursor.fetchone() == ("A",)
    assert mark(user.pk) is None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM credit_ledger WHERE user_id = %s AND created_xid <> '1'",
            [user.pk],
        )
        assert cursor.fetchone() == (0,)
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 4
    settle()
    admit(user)
    assert mark(user.pk).entries == 5
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 3
    assert_invariants()


def test_a_mark_above_the_counter_goes_with_the_next_entry():
    """Ignored, a future mark would count again once the counter passed it, leaving out
    the entries written meanwhile: the next entry's insert removes it."""
    user = funded_user(credits=3)
    with connection.cursor() as cursor:
        future_mark(cursor, user.pk, balance=3, ahead=200)
        grant_sql(cursor, user.pk, amount=5)
    assert mark(user.pk) is None
    with connection.cursor() as cursor:  # the counter passes the old mark's horizon
        for _ in range(210):
            cursor.execute("SELECT pg_current_xact_id()")
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 8


def test_an_entry_copied_in_with_its_old_id_drops_the_users_mark():
    """A data-only restore of the same cluster's dump brings marks that fold the entries
    it copies in: each such entry removes its user's mark, so it is not counted twice."""
    user = funded_user(credits=2)
    settle()
    admit(user)
    folded = mark(user.pk)
    assert folded is not None
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at, created_xid)"
            " VALUES (%s, 'grant', 4, 'restored', now(), %s::xid8)",
            [user.pk, str(int(str(folded.horizon)) - 1)],
        )
    assert mark(user.pk) is None
    assert credit_balance(user_id=user.pk) == ledger_sum(user.pk) == 5


def test_the_stamp_fires_on_a_replica_apply_too():
    """A logical replica applies rows with session_replication_role = replica, where an
    ordinary trigger does not fire: the stamp is enabled ALWAYS."""
    user = funded_user(credits=0)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "INSERT INTO credit_ledger (user_id, kind, amount, note, created_at, created_xid)"
            " VALUES (%s, 'grant', 1, 'applied', now(), '1') RETURNING created_xid::text",
            [user.pk],
        )
        assert cursor.fetchone()[0] != "1"


def test_rebases_while_admissions_and_grants_run_lose_no_entry():
    """``rebase_credit_marks`` while two users' admissions fold and another session
    commits grants, in rounds: the rebase's lock orders it against each of them (an
    admission's statement takes its snapshot after the lock), so after every round each
    balance is the ledger's sum. Checked per round, before the next rebase drops the
    marks (and with them any mark a round folded wrong)."""
    users = [funded_user(credits=500) for _ in range(2)]
    errors: list[BaseException] = []
    rebased: list[int] = []

    def running(body) -> None:
        try:
            body()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    def granting(stop: threading.Event) -> None:
        with psycopg.connect(database_url(), autocommit=True) as other:
            while not stop.is_set():
                for user in users:
                    grant_sql(other.cursor(), user.pk)

    def admitting(user) -> None:
        for _ in range(10):
            with contextlib.suppress(QueueFull):
                admit(user)

    def rebasing(delay: float) -> None:
        from runs.credits import credit_marks_rebase

        time.sleep(delay)
        rebased.append(credit_marks_rebase().marks)

    for delay in (0.0, 0.005, 0.01, 0.02):
        stop = threading.Event()
        background = threading.Thread(target=running, args=(lambda s=stop: granting(s),))
        workers = [
            threading.Thread(target=running, args=(lambda u=u: admitting(u),)) for u in users
        ]
        workers.append(threading.Thread(target=running, args=(lambda d=delay: rebasing(d),)))
        background.start()
        for thread in workers:
            thread.start()
        for thread in workers:
            thread.join()
        stop.set()
        background.join()

        assert not errors, errors
        for user in users:
            assert credit_balance(user_id=user.pk) == ledger_sum(user.pk)
        assert_invariants()
    assert sum(rebased[1:]) > 0  # admissions folded before a rebase: the race was run
