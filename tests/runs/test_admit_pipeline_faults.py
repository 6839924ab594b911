"""The admit's one round trip (BEGIN, the user's lock, the statement, COMMIT, its
parameters bound before the pipeline opens) when something goes wrong: a value that
cannot be bound, a lock timeout, the connection lost while it waits for the lock. Each
leaves nothing written (no job, no held run, no charge), the user's lock free, and the
session usable or closed, never inside a transaction."""

from __future__ import annotations

import threading

import psycopg
import pytest
from django.db import DataError, OperationalError, connection, connections, transaction
from psycopg.pq import TransactionStatus

from queueing import locks
from runs import admission
from runs.models import AnalysisJob, CoreRun
from runs.queue import ANALYSIS_QUEUE
from runs.selectors import credit_balance
from tests.runs.factories import DOC_HTML, SOURCES, funded_user

pytestmark = pytest.mark.django_db(transaction=True)


def admit(user, title: str = "T"):
    return admission.analysis_job_admit(user=user, title=title, doc_html=DOC_HTML, sources=SOURCES)


def nothing_written(user) -> bool:
    return (
        not AnalysisJob.objects.filter(user=user).exists()
        and not CoreRun.objects.filter(user_id=user.pk).exists()
        and credit_balance(user_id=user.pk) == 3
    )


def hold_user_lock(user) -> psycopg.Connection:
    """Another session holding the user's queue lock, in a transaction left open."""
    holder = psycopg.connect(**connection.get_connection_params())
    statement, params = locks.xact_lock_statement(ANALYSIS_QUEUE.namespace, user.pk)
    holder.execute(statement, params)
    return holder


def test_a_value_that_cannot_be_bound_writes_nothing_and_takes_no_lock():
    user = funded_user(credits=3)
    with pytest.raises(DataError):
        admit(user, title="T\x00")
    assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    assert nothing_written(user)
    # Inside the caller's transaction: nothing was sent, the transaction goes on.
    with transaction.atomic():
        with pytest.raises(DataError):
            admit(user, title="T\x00")
        admitted = admit(user)
    assert AnalysisJob.objects.get(user=user).pk == admitted.id


def test_a_lock_timeout_writes_nothing_and_leaves_the_session_idle():
    user = funded_user(credits=3)
    holder = hold_user_lock(user)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '20ms'")
        with pytest.raises(OperationalError):
            admit(user)
        assert connection.connection.info.transaction_status == TransactionStatus.IDLE
    finally:
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert nothing_written(user)
    assert AnalysisJob.objects.get(pk=admit(user).id).status == "pending"


def test_a_connection_lost_while_waiting_for_the_lock_writes_nothing():
    user = funded_user(credits=3)
    holder = hold_user_lock(user)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["pid"] = connection.cursor().connection.info.backend_pid
            outcome["admit"] = admit(user)
        except BaseException as exc:
            outcome["admit"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    poller = psycopg.connect(**connection.get_connection_params(), autocommit=True)
    try:
        while True:  # until the admit waits for the lock (no timed assertion)
            row = poller.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone()
            if row is not None:
                break
            if not thread.is_alive():
                break
        assert row is not None, outcome
        poller.execute("SELECT pg_terminate_backend(%s)", [row[0]])
        thread.join()
    finally:
        holder.close()
        poller.close()
    assert isinstance(outcome["admit"], OperationalError), outcome
    assert nothing_written(user)
    assert AnalysisJob.objects.get(pk=admit(user).id).status == "pending"
