"""The statements that walk the waiting jobs' index run under planner settings of their own.

The worker's fetch (``pgstage_fetch_job_v1``, which ``fetch_job`` in ``sql/worker.sql``
calls) and the count of jobs no live worker can run (``unrunnable_tasks`` in
``sql/queueing.sql``) list the distinct (task, queue) pairs of the waiting jobs with one
descent each of ``pgstage_jobs_todo_by_task_idx`` (a loose index scan, ordered by that
index's key).
PostgreSQL plans them by the table's statistics, and those are often wrong for a queue:
after a quiet spell autovacuum leaves statistics that say a few dozen rows, mostly
finished; a burst of waiting jobs then looks like a handful. With that estimate the
planner read the waiting jobs through procrastinate's priority index and sorted them,
every one of them on every fetch (60,006 rows read per fetch at 10,000 waiting jobs,
``tests/queueing/test_fetch.py``): a backlog then slowed down its own fetch.

So both run with ``enable_sort`` off, local to their own transaction: the only plan of a
walk ordered by the index's key that needs no sort is the walk of that index, whatever
the statistics say. The resume tick's search for analyses whose ``process_job`` is gone
(``lost_process_jobs`` and ``resume_work`` in ``runs/sql/runs.sql``) runs so too: it asks
each one's EXCLUSIVE key in the key's order, which only ``pgstage_jobs_exclusive_key``
gives without a sort (asked by ``=``, statistics that say no job waits made the planner
walk every waiting job's entry in procrastinate's ``procrastinate_jobs_id_lock_idx_v1``
for each analysis instead). ``jit`` is off too: a disabled sort that a plan cannot avoid (the few
rows a statement orders after the walk) costs the planner's penalty, which would
otherwise put the statement above ``jit_above_cost`` and compile it (0.8 s).

For the other walks the settings and the statement travel in one pipeline, on the
worker's pool and on a Django connection outside a transaction: PostgreSQL runs them as
one implicit transaction, so still one round trip, and the settings end with it (also
when the statement fails). Inside the caller's transaction they are restored after the
statement.

The fetch is a function, ``pgstage_fetch_job_v1`` (migration ``0015_fetch_job_function``),
whose own ``SET`` clauses are :data:`FETCH_SETTINGS` and ``plan_cache_mode =
force_generic_plan``: in force while it runs, undone when it returns, and the worker sends
one short statement. PL/pgSQL plans its statement on the first call in a server session
and keeps that plan for the session, behind a transaction pooler too. Left to
PostgreSQL, a prepared fetch was planned anew for its first runs on each connection (the
server tries five custom plans before a generic one), and for good when the custom plans'
estimates came out below the generic one's: 1.8 ms of planning before a 0.4 ms fetch. A
generic plan is kept until the table's statistics change, so it must not depend on them:
the fetch runs without sequential scans, hash or merge joins (:data:`FETCH_SETTINGS`), and
its statement looks each job up by primary key; a plan made on an empty table then walks
a later burst as a fresh one does (``tests/queueing/test_fetch_generic.py``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from asgiref.sync import sync_to_async
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DatabaseError
from procrastinate import exceptions as procrastinate_exceptions
from procrastinate import psycopg_connector

from queueing import sql

__all__ = [
    "FETCH_SETTINGS",
    "WALK_SETTINGS",
    "rows_walking",
    "rows_walking_async",
]

#: Local to the transaction: a sort-free plan where one exists, and no JIT compilation.
WALK_SETTINGS = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"
#: The fetch's: :data:`WALK_SETTINGS`, and no sequential scan, hash join or merge join —
#: its plan is index walks, lookups by primary key and nested loops, whatever the
#: statistics say (a plan made while the table was empty must still fit a burst). The
#: fetch function's own ``SET`` clauses say the same, and ``plan_cache_mode =
#: force_generic_plan`` besides; as a statement, for a session that plans its statement
#: as the function does (the tests' EXPLAIN).
FETCH_SETTINGS = WALK_SETTINGS + (
    ", set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true)"
    ", set_config('enable_mergejoin', 'off', true)"
)
_SAVED = "SELECT current_setting('enable_sort'), current_setting('jit')"
_RESTORE = "SELECT set_config('enable_sort', %s, true), set_config('jit', %s, true)"


def rows_walking(
    query: str, params: dict[str, Any], *, using: str = DEFAULT_DB_ALIAS
) -> list[dict[str, Any]]:
    """``query``'s rows (as dicts) on Django's connection ``using``, under
    :data:`WALK_SETTINGS`.
    Outside a transaction, the settings and the statement travel in one pipeline (one
    round trip, one implicit transaction, as on the worker's pool), on the connection's
    statement cursor (:func:`queueing.sql.statement_cursor`: prepared where the
    connection prepares). Inside the caller's transaction the settings are restored after
    the statement."""
    connection = connections[using]
    if _in_transaction(connection):
        with connection.cursor() as cursor:
            cursor.execute(_SAVED)
            saved = cursor.fetchone()
            cursor.execute(WALK_SETTINGS)
            cursor.execute(query, params)
            rows = _dicts(cursor)
            # Only on success: a failed statement aborted the transaction, whose
            # rollback ends the settings.
            cursor.execute(_RESTORE, list(saved))
            return rows
    with sql.statement_cursor(connection) as cursor, connection.wrap_database_errors:
        raw = connection.connection
        for attempt in (1, 2):
            try:
                with raw.pipeline():
                    cursor.execute(WALK_SETTINGS)
                    cursor.execute(query, params)
                return _dicts(cursor)
            except sql.STALE_PLAN_ERRORS as error:
                # Refused at the pipeline's sync: the cursor's own replan never saw it.
                if attempt == 2 or not sql.may_replan(raw, error):
                    raise
                sql.forget_prepared(raw)
    raise AssertionError("unreachable")


def _in_transaction(connection: Any) -> bool:
    """Whether a statement on Django's connection now runs inside a transaction: an
    ``atomic()`` block, autocommit turned off, or a transaction begun by hand (``BEGIN``
    on a cursor), which Django's own state does not see — the settings must then be
    restored after the statement, not left to the pipeline's implicit transaction."""
    if connection.in_atomic_block or not connection.get_autocommit():
        return True
    status = connection.connection.info.transaction_status
    return status != psycopg.pq.TransactionStatus.IDLE


def _dicts(cursor: Any) -> list[dict[str, Any]]:
    columns = [column[0] for column in cursor.description]
    return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]


async def rows_walking_async(connector: Any, query: str, **arguments: Any) -> list[dict[str, Any]]:
    """``query``'s rows through procrastinate's ``connector``, under
    :data:`WALK_SETTINGS`: on the worker's psycopg pool in one round trip; on another
    connector (Django's, in-process) as :func:`rows_walking`, on that connector's
    database alias."""
    if isinstance(connector, psycopg_connector.PsycopgConnector):
        return await _pipelined(connector, query, arguments)
    # procrastinate's Django connector runs on its database alias.
    using = getattr(connector, "alias", DEFAULT_DB_ALIAS)
    try:
        return await sync_to_async(rows_walking)(query, arguments, using=using)
    except DatabaseError as exc:  # as procrastinate's connectors raise it: the worker's
        raise procrastinate_exceptions.ConnectorException from exc  # loops retry that


@psycopg_connector.wrap_exceptions()
async def _pipelined(
    connector: psycopg_connector.PsycopgConnector, query: str, arguments: dict[str, Any]
) -> list[dict[str, Any]]:
    async with connector.pool.connection() as conn:
        for attempt in (1, 2):
            async with connector._get_cursor(connection=conn) as cursor:
                try:
                    async with conn.pipeline():
                        await conn.execute(WALK_SETTINGS)
                        await cursor.execute(query, connector._wrap_json(arguments))
                    return await cursor.fetchall()
                except sql.STALE_PLAN_ERRORS as error:
                    # queueing.connector.ReplanningCursor's rule; in a pipeline the
                    # refusal arrives at the sync, not at the execute it wraps.
                    if attempt == 2 or not sql.may_replan(conn, error):
                        raise
                    async with conn.transaction(force_rollback=True):
                        pass
    raise AssertionError("unreachable")
