"""The worker's connector: procrastinate's psycopg connector, one round trip per statement.

procrastinate's worker talks to the database in single statements (fetch a job, save its
outcome, defer, retry, the periodic defers). Its connector lends a pooled connection per
statement, and with its defaults each one costs four round trips: the pool's liveness
check (an empty statement), ``BEGIN``, the statement, ``COMMIT``. Here the same
statements cost one:

* **Autocommit.** A single statement is atomic on its own; ``BEGIN``/``COMMIT`` around it
  add two waits and no guarantee. Every query procrastinate and pgstage send through the
  connector is one statement (a multi-step one is a SQL function), so none needs a block.
* **No round trip to check a lent connection.** A connection the server ended while it
  sat in the pool (a restart, ``pg_terminate_backend``, an idle timeout) has its goodbye
  waiting on the socket: the check looks at the socket, closes such a connection and the
  pool lends another at once (:class:`queueing.outage.WorkerPool` applies the check, without
  psycopg_pool's growing sleeps between failed ones). A connection that dies later fails
  its statement, which the worker's loops retry (``queueing.worker``), and the pool
  replaces it. After an outage the worker still checks every pooled connection with a
  round trip, once (``PgstageWorker._reopen_pool``).
* **Prepared statements.** The worker's hot statements (its fetch, the saved outcomes)
  are large, and PostgreSQL spends longer planning the fetch than running it (1.1 to 2.0
  ms against about 1.3 ms, by EXPLAIN ANALYZE over a backlog). The pool's connections
  prepare a statement on its fifth run (psycopg's ``prepare_threshold``, which Django
  turns off for its own connections), so the server plans it once per connection and
  then reuses the plan. A worker connects to PostgreSQL directly or through a session
  pool (LISTEN needs a session, see docs/deploy.md), where a prepared statement stays
  with its connection. ``OPTIONS["prepare_threshold"]`` of the database, when set, is
  taken as it is (``None``: never).
  A deploy's migration that changes the type of a column a prepared statement returns
  makes PostgreSQL refuse that statement on every connection that prepared it ("cached
  plan must not change result type"); the pool's cursors (:class:`ReplanningCursor`)
  then forget the connection's prepared statements and run the statement again, once:
  it had not run. So does a prepared statement the server lost behind psycopg's back.
* **A start that waits for the database.** The pool (:class:`queueing.outage.WorkerPool`)
  opens once the database answers, trying for the outage window
  (``QUEUEING_DATABASE_OUTAGE_SECONDS``), where procrastinate's gives up after 30 s.

The heartbeat and LISTEN keep connections of their own, outside this pool.
"""

from __future__ import annotations

import select
from typing import Any

import psycopg
import psycopg_pool
from django.conf import settings
from procrastinate import psycopg_connector
from procrastinate.contrib.django.utils import connector_params

from queueing.outage import WorkerPool
from queueing.sql import STALE_PLAN_ERRORS, may_replan

__all__ = ["worker_connector"]


class ReplanningCursor(psycopg.AsyncCursor):
    """psycopg's async cursor, for an autocommit connection that prepares statements: a
    statement refused because its plan went stale (``queueing.sql.plan_went_stale``: a
    migration changed a column it returns) runs again, once, after the connection
    forgets its prepared statements. Without it the refusal repeats on that connection
    until it is closed (a worker's fetch would fail for the pool connection's life)."""

    async def execute(self, query, params=None, *, prepare=None, binary=None):
        try:
            return await super().execute(query, params, prepare=prepare, binary=binary)
        except STALE_PLAN_ERRORS as error:
            if not may_replan(self.connection, error):
                raise
            # An empty transaction rolled back: psycopg then always forgets its names
            # and sends DEALLOCATE ALL (queueing.sql.forget_prepared).
            async with self.connection.transaction(force_rollback=True):
                pass
            return await super().execute(query, params, prepare=prepare, binary=binary)


def ended_by_server(connection: Any) -> bool:
    """Whether the server has ended ``connection`` (a psycopg connection, sync or async)
    while it sat idle — without a round trip: an idle connection has nothing to read
    unless the server said goodbye (or, rarely, sent a notice: then one reconnect is the
    price)."""
    if connection.closed or connection.broken:
        return True
    try:
        poller = select.poll()
        poller.register(connection.fileno(), select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError, psycopg.Error):
        return True


async def _check(connection: psycopg.AsyncConnection) -> None:
    """The pool's check on every lent connection: refuse (and close) one the server ended,
    so the pool replaces it and lends another."""
    if ended_by_server(connection):
        await connection.close()
        raise psycopg.OperationalError("the server ended this pooled connection")


async def _autocommit(connection: psycopg.AsyncConnection) -> None:
    """Every new pooled connection runs in autocommit (a local setting: no round trip),
    its cursors replanning a statement whose plan went stale."""
    await connection.set_autocommit(True)
    connection.cursor_factory = ReplanningCursor


def _pool(**kwargs: Any) -> psycopg_pool.AsyncConnectionPool:
    # procrastinate passes its round-trip check (check_connection); the socket's is ours.
    # Its opening waits for the database for the outage window, not the pool's 30 s.
    from queueing.worker import outage_seconds

    return WorkerPool(**{**kwargs, "check": _check}, window=outage_seconds())


#: The pool's connections prepare a statement on its fifth run (psycopg's default).
PREPARE_THRESHOLD = 5


def prepare_threshold(alias: str = "default") -> int | None:
    """How many runs of a statement on a pooled connection before it is prepared: the
    database's ``OPTIONS["prepare_threshold"]`` when it sets one (``None``: never), else
    :data:`PREPARE_THRESHOLD`."""
    options = settings.DATABASES[alias].get("OPTIONS") or {}
    if "prepare_threshold" in options:
        return options["prepare_threshold"]
    return PREPARE_THRESHOLD


def worker_connector(
    alias: str = "default", **pool_args: Any
) -> psycopg_connector.PsycopgConnector:
    """The connector pgstage's worker runs on: procrastinate's ``PsycopgConnector`` on the
    Django database ``alias``, in autocommit, without a liveness round trip per lent
    connection, preparing its statements (:func:`prepare_threshold`); ``pool_args`` go to
    the pool (``min_size``, ``max_size`` …). Each call is one statement in one round trip."""
    kwargs = {**connector_params(alias), "prepare_threshold": prepare_threshold(alias)}
    return psycopg_connector.PsycopgConnector(
        kwargs=kwargs, configure=_autocommit, pool_factory=_pool, **pool_args
    )
