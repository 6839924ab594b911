"""Named SQL blocks, loaded from ``queueing/sql/*.sql`` (procrastinate's format).

A block starts with ``-- name --`` and a description line. Blocks that name tables or
columns use ``{placeholders}``; :func:`render` fills them with quoted identifiers via
``psycopg.sql``, never with string formatting of values. Every value is a bound parameter.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from psycopg import adapt, pq
from psycopg import sql as psql
from psycopg.generators import send

_BLOCK = re.compile(r"^-- (?P<name>[a-z0-9_]+) --\n(?:--[^\n]*\n)*", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    matches = list(_BLOCK.finditer(text))
    queries = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        queries[match["name"]] = text[match.end() : end].strip()
    return queries


@cache
def load(package: str, filename: str) -> dict[str, str]:
    return parse(resources.files(package).joinpath("sql", filename).read_text())


queries = load("queueing", "queueing.sql")


def _part(value: str | tuple[str, ...] | psql.Composable) -> psql.Composable:
    if isinstance(value, psql.Composable):
        return value
    if isinstance(value, tuple):
        return psql.SQL(", ").join(psql.Identifier(v) for v in value)
    return psql.Identifier(value)


def placeholders(names: tuple[str, ...]) -> psql.Composable:
    """``%(a)s, %(b)s`` for bound parameters named ``names``."""
    return psql.SQL(", ").join(psql.Placeholder(n) for n in names)


def render(template: str, **identifiers: str | tuple[str, ...] | psql.Composable) -> str:
    """Fill ``{name}`` placeholders with quoted identifiers (tuples become lists) or with
    composed fragments such as :func:`placeholders`."""
    parts = {name: _part(value) for name, value in identifiers.items()}
    return psql.SQL(template).format(**parts).as_string(None)


@functools.lru_cache(maxsize=64)
def array_literal(values: tuple[str | float, ...]) -> str:
    """``values`` as PostgreSQL's array input text (``{"a","b"}``), for a parameter cast to
    an array type in the statement (``%(names)s::varchar[]``). psycopg sends a ``str`` as
    text of unknown type, which the cast parses on the server; a list it would dump
    element by element on every call. Cached: a worker's fetch sends the same arrays
    each time."""
    quoted = (str(v).replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return "{" + ",".join(f'"{v}"' for v in quoted) + "}"


def plan_went_stale(error: BaseException | None) -> bool:
    """Whether ``error`` (a psycopg error, or Django's wrapping one) is PostgreSQL refusing
    to run a prepared statement of psycopg's that cannot run as prepared any more, before
    it ran:

    * its result columns changed since it was prepared ("cached plan must not change
      result type", 0A000): another session altered the type of a column the statement
      returns, or added one a ``*`` returns (a deploy's migration). The same name fails
      so on this connection until it is prepared again;
    * the server no longer has it (26000 on one of psycopg's ``_pg3_`` names): something
      dropped the session's prepared statements behind psycopg's back (a ``DISCARD ALL``
      or ``DEALLOCATE ALL`` it did not see)."""
    if error is not None and not isinstance(error, psycopg.Error):
        error = error.__cause__
    if isinstance(error, psycopg.errors.FeatureNotSupported):
        # The function is the server's, in every language; the message a fallback.
        return error.diag.source_function == "RevalidateCachedQuery" or (
            "cached plan must not change result type" in str(error)
        )
    return isinstance(error, psycopg.errors.InvalidSqlStatementName) and '"_pg3_' in str(error)


#: The errors :func:`plan_went_stale` can recognise (a cursor catches these, then asks).
STALE_PLAN_ERRORS = (psycopg.errors.FeatureNotSupported, psycopg.errors.InvalidSqlStatementName)


def may_replan(connection: Any, error: BaseException) -> bool:
    """Whether the statement that failed with ``error`` on the psycopg ``connection`` can
    run again at once on new plans: its plan went stale and no transaction holds the
    connection (autocommit: the statement was its own). Inside a transaction the error
    aborted it; its rollback makes psycopg forget the connection's prepared statements,
    and the next transaction prepares them again."""
    return (
        plan_went_stale(error) and connection.info.transaction_status == pq.TransactionStatus.IDLE
    )


def forget_prepared(connection: psycopg.Connection) -> None:
    """Make the psycopg ``connection`` (idle, autocommit) and its server session forget
    every prepared statement: an empty transaction rolled back, after which psycopg
    always clears its names and sends ``DEALLOCATE ALL`` (a ``DEALLOCATE ALL`` of our
    own is honoured only the first time psycopg meets its text on the connection).
    Each statement's next run on it is a first run again (:class:`_PreparingCursor`)."""
    with connection.transaction(force_rollback=True):
        pass
    _seen.pop(connection, None)


#: The statements each connection has run through a :class:`_PreparingCursor` (only asked
#: where psycopg does not tell which statements it holds prepared).
_seen: weakref.WeakKeyDictionary[Any, set[Any]] = weakref.WeakKeyDictionary()


def _long_statement_query_class() -> type[Any] | None:
    """psycopg's query class, converting every statement's text once per process.

    psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` by parsing its text,
    and caches the result only for statements of at most 4 kB and 50 parameters, which
    an ORM's generated statements exceed with varying texts. The framework's statements
    are few and fixed (rendered once per process), but the admission's is over 5 kB:
    parsed again on every admit, a fifth of the admit's client time. Here the parse of
    any statement run through :class:`_PreparingCursor` is cached (by its text: at most
    :data:`_CONVERTED_MAX`). None where psycopg lacks what this needs."""
    try:
        from psycopg import _queries

        parse_text = _queries._query2pg_nocache
        base = _queries.PostgresQuery
        base._ensure_bytes  # noqa: B018 (present on the versions this was written for)
    except (ImportError, AttributeError):
        return None
    global converted_texts
    cached = converted_texts = functools.lru_cache(maxsize=_CONVERTED_MAX)(parse_text)

    class CachedQuery(base):  # type: ignore[misc, valid-type]
        __slots__ = ()

        def convert(self, query: Any, vars: Any) -> None:
            if vars is None or not isinstance(query, str | bytes):
                return super().convert(query, vars)
            text = self._ensure_bytes(query)
            self.query, self._want_formats, self._order, self._parts = cached(  # type: ignore[misc]
                text, self._tx.encoding
            )
            self.dump(vars)
            return None

    return CachedQuery


#: The converted statement texts :class:`_PreparingCursor` keeps (each a few kB).
_CONVERTED_MAX = 256
#: The cache of those conversions (its ``cache_info()``), None where psycopg lacks it.
converted_texts: Any = None


class _PreparingCursor(psycopg.Cursor):
    """Server-side binding, each statement prepared on its first run on the connection.

    A statement that psycopg does not hold prepared on the connection (with its
    parameters' types: ``None`` and a datetime, or a small and a large integer, make two
    prepared statements of one text), outside a pipeline, runs in one of its own: psycopg
    would otherwise wait for the server to prepare it before it sends the execution (a
    second round trip). A prepared one needs no pipeline (its bookkeeping costs the client
    more than the one round trip it would save). psycopg forgets every prepared statement
    of the connection on a rollback (a savepoint's too), a ``DROP`` or an ``ALTER``, and
    its oldest one past ``prepared_max``: each is prepared again in the round trip of its
    next run.

    A statement refused because its plan went stale (:func:`plan_went_stale`) outside a
    transaction runs again, once, after the connection forgets its prepared statements."""

    #: The statement :meth:`_holds_prepared` converted (the text, the parameters and
    #: psycopg's query), for psycopg's own conversion of the same execute to take.
    _converted: tuple[Any, Any, Any] | None = None
    _query_cls = _long_statement_query_class() or psycopg.Cursor._query_cls

    def _convert_query(self, query, params=None):
        converted, self._converted = self._converted, None
        if converted is not None and converted[0] is query and converted[1] is params:
            return converted[2]
        return super()._convert_query(query, params)

    def _holds_prepared(self, query: Any, params: Any) -> bool:
        """Whether psycopg holds ``query``, with the types of ``params``, prepared on this
        cursor's connection; where psycopg does not tell, whether the connection has run
        it through this class."""
        connection = self.connection
        manager = getattr(connection, "_prepared", None)
        names = getattr(manager, "_names", None)
        if manager is None or names is None or not hasattr(psycopg.Cursor, "_convert_query"):
            return query in _seen.get(connection, ())
        if getattr(self, "_tx", None) is None:  # a new cursor: psycopg makes it on a run
            self._tx = adapt.Transformer(self)
        pgq = super()._convert_query(query, params)
        self._converted = (query, params, pgq)
        return manager.key(pgq) in names

    def execute(self, query, params=None, *, prepare=True, binary=None):
        try:
            return self._execute(query, params, prepare=prepare, binary=binary)
        except STALE_PLAN_ERRORS as error:
            if not may_replan(self.connection, error):
                raise
            forget_prepared(self.connection)
            return self._execute(query, params, prepare=prepare, binary=binary)

    def _execute(self, query, params, *, prepare, binary):
        connection = self.connection
        try:
            if connection.pgconn.pipeline_status != pq.PipelineStatus.OFF:
                super().execute(query, params, prepare=prepare, binary=binary)
            elif _opens_transaction(connection):
                # The statement opens the caller's transaction: BEGIN travels with it.
                with _beginning(connection):
                    super().execute(query, params, prepare=prepare, binary=binary)
            elif self._holds_prepared(query, params):
                super().execute(query, params, prepare=prepare, binary=binary)
            elif _autocommit_idle(connection):
                with committed(connection):
                    super().execute(query, params, prepare=prepare, binary=binary)
            else:
                with held_pipeline(connection):
                    super().execute(query, params, prepare=prepare, binary=binary)
        finally:
            self._converted = None
        _seen.setdefault(connection, set()).add(query)
        return self


#: Whether the caller can send psycopg's own BEGIN (with the connection's isolation level
#: and read-only setting) for it (psycopg 3: :func:`_beginning`).
_CAN_SEND_BEGIN = hasattr(psycopg.Connection, "_get_tx_start_command")


def _opens_transaction(connection: psycopg.Connection) -> bool:
    """Whether psycopg would open a transaction before the next statement on the
    ``connection`` (not autocommit, none open yet: Django's ``atomic()`` before its first
    statement). psycopg sends that BEGIN on its own and waits for it, even in a pipeline."""
    return (
        not connection.autocommit
        and connection.pgconn.transaction_status == pq.TransactionStatus.IDLE
        and _CAN_SEND_BEGIN
        and hasattr(connection, "_autocommit")
    )


@contextmanager
def _beginning(connection: psycopg.Connection) -> Iterator[None]:
    """A pipeline on the ``connection`` (not autocommit, no transaction open) whose first
    statement is the BEGIN psycopg would send: the statements of the block follow it in
    the same round trip, where psycopg would wait for its BEGIN alone first. psycopg is
    told the connection is in autocommit for the block's length only, so it sends no
    BEGIN of its own; when the block ends the server has the transaction open (or
    failed), as after psycopg's own BEGIN."""
    begin = connection._get_tx_start_command()
    connection._autocommit = True
    try:
        with held_pipeline(connection):
            psycopg.Cursor(connection).execute(begin, prepare=False)
            yield
    finally:
        connection._autocommit = False


@contextmanager
def pipelined(connection: Any) -> Iterator[None]:
    """Send every statement the block executes on the Django ``connection`` together,
    when the block ends, and wait once (a psycopg pipeline, :func:`held_pipeline`): one
    round trip for all of them, and for the BEGIN too when the block's first statement
    opens the caller's transaction. Read no result inside the block (each read sends the
    statements so far and waits for them: a round trip more); read them after it.

    Outside a transaction (autocommit), the block is a transaction of its own
    (:func:`committed`): its statements commit together or not at all.

    A statement that fails makes the server skip the rest up to the block's end; the
    error is raised when the block ends (as Django's ``DatabaseError``), and the caller's
    transaction is then failed, as after any failed statement in it (outside one, the
    block's own is rolled back). Results of the statements before the failed one can
    still be read."""
    connection.ensure_connection()
    raw = connection.connection
    with connection.wrap_database_errors:
        if raw.pgconn.pipeline_status != pq.PipelineStatus.OFF:
            yield  # inside the caller's pipeline: its end is the round trip
        elif _opens_transaction(raw):
            with _beginning(raw):
                yield
        elif _autocommit_idle(raw):
            with committed(raw):
                yield
        else:
            with held_pipeline(raw):
                yield


def _autocommit_idle(connection: psycopg.Connection) -> bool:
    return connection.autocommit and connection.pgconn.transaction_status == _IDLE


#: A session outside any transaction, and inside a transaction block (a broken one is
#: neither).
_IDLE = pq.TransactionStatus.IDLE
_IN_BLOCK = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)


#: The most statements a pipeline holds back (:func:`_held`); past them it sends as psycopg
#: does. A transaction of the framework is a few; an ``executemany`` is one per row.
HOLD_COMMANDS = 32


@contextmanager
def _held(pipeline: Any) -> Iterator[None]:
    """Keep the block's statements on the client, queued in the psycopg ``pipeline``, and
    send them to the server together when the block ends: one write, after the block's
    last statement is queued.

    psycopg sends each statement of a pipeline as it is executed, and between two of them
    the sending thread may wait for the interpreter lock while other threads run. For a
    transaction whose statements take a lock (a key's, a row's), the server would hold it
    across that client time, until the COMMIT arrives; sent together, the server runs
    BEGIN to COMMIT without waiting for the client. A read inside the block (a result
    fetched, a nested sync) sends what was held first, and so does a block longer than
    :data:`HOLD_COMMANDS` (its rows would wait in memory, and libpq sends its buffer 8 KB
    at a time as it grows anyway); from there on the block's statements go as psycopg
    sends them. Where psycopg does not have the
    pipeline's parts this relies on, statements go as psycopg sends them."""
    communicate = getattr(pipeline, "_communicate_gen", None)
    fetch = getattr(pipeline, "_fetch_gen", None)
    queue = getattr(pipeline, "command_queue", None)
    held_already = "_communicate_gen" in vars(pipeline)
    if communicate is None or fetch is None or queue is None or held_already:
        yield
        return
    holding = True

    def restore() -> None:
        # psycopg's own communication again: it sends what is queued, as it goes.
        nonlocal holding
        holding = False
        del pipeline._communicate_gen, pipeline._fetch_gen

    def release() -> None:
        if holding:
            restore()
            # libpq buffers a pipeline's messages; the next flush sends them at once.
            try:
                while queue:
                    queue.popleft()()
            except BaseException:
                # A signal's exception between a command's removal and its call loses
                # that command: what follows it (the COMMIT) must not reach the server
                # without it. Closing the connection drops what libpq still holds; the
                # server rolls back what it got (psycopg's own loop is compiled, without
                # such a gap).
                pipeline.pgconn.finish()
                raise

    def fetch_sent(*, flush: bool) -> Iterator[Any]:
        release()
        yield from send(pipeline.pgconn)
        return (yield from fetch(flush=flush))

    def hold() -> Iterator[Any]:
        if len(queue) > HOLD_COMMANDS:
            # A long block (an executemany): holding it would keep every row in memory,
            # and libpq sends past 8 KB anyway. From here on psycopg sends as it goes.
            release()
            return (yield from communicate())
        return None

    pipeline._communicate_gen = hold
    pipeline._fetch_gen = fetch_sent
    try:
        yield
    except BaseException:
        # psycopg's exit sends what is queued, and reads what failed.
        if holding:
            restore()
        raise
    # psycopg calls hold() and fetch_sent() holding the connection's lock; here it is ours.
    with getattr(pipeline, "_lock", None) or pipeline._conn.lock:
        release()


@contextmanager
def held_pipeline(connection: psycopg.Connection) -> Iterator[None]:
    """A pipeline on the psycopg ``connection`` whose statements reach the server together,
    in one write, when the block ends (:func:`_held`)."""
    with connection.pipeline() as pipeline, _held(pipeline):
        yield


@contextmanager
def committed(connection: psycopg.Connection) -> Iterator[None]:
    """A pipeline on the psycopg ``connection`` (autocommit, no transaction open) whose
    statements are one transaction: ``BEGIN``, the block's statements, ``COMMIT``, in one
    round trip. Not the pipeline's implicit transaction, committed at its Sync: a
    deferred constraint that fails there (Django's foreign keys are checked at commit: a
    row referring to one deleted meanwhile) leaves psycopg's connection unusable, where
    a COMMIT's failure is an error like any other. A failed block is rolled back here
    (psycopg's rollback, which also forgets the connection's prepared statements)."""
    try:
        with held_pipeline(connection):
            psycopg.Cursor(connection).execute("BEGIN", prepare=False)
            yield
            psycopg.Cursor(connection).execute("COMMIT", prepare=False)
    except BaseException:
        if connection.pgconn.transaction_status in _IN_BLOCK:
            connection.rollback()
        raise


def prepares(connection: Any) -> bool:
    """Whether the Django ``connection`` may hold prepared statements: its database's
    ``OPTIONS`` set psycopg's ``prepare_threshold`` (Django leaves it ``None``, and a
    transaction pooler before PgBouncer 1.21 cannot carry them)."""
    raw = connection.connection
    return raw is not None and raw.prepare_threshold is not None


class _DebugCursor(CursorDebugWrapper):
    """Django's query log for a prepared statement: psycopg keeps no text of what it sent
    (the statement is named), so the log holds the statement as it was written."""

    def debug_sql(self, sql=None, params=None, use_last_executed_query=False, many=False):
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


def preparing_cursor(connection: Any) -> Any:
    """A cursor of the Django ``connection`` (its execute wrappers and query log intact)
    whose statements are bound on the server and prepared on their first run: the server
    parses and plans a large statement once per connection. Only where :func:`prepares`;
    Django's own cursors bind on the client and never prepare."""
    connection.ensure_connection()
    cursor = _PreparingCursor(connection.connection)
    if connection.queries_logged:
        return _DebugCursor(cursor, connection)
    return connection.make_cursor(cursor)


class _BeginRides:
    """Django's cursor wrapper, except that a statement that opens the caller's transaction
    sends psycopg's BEGIN with it, in one round trip (:func:`_beginning`)."""

    db: Any
    cursor: Any

    def _execute(self, sql, params, *ignored):
        # Django's executor, inside its execute wrappers and its query log's timing: they
        # see the whole round trip and its error. The raw connection is the cursor's own.
        raw = self.cursor.connection
        if (
            raw.closed
            or raw.pgconn.pipeline_status != pq.PipelineStatus.OFF
            or not _opens_transaction(raw)
        ):
            return super()._execute(sql, params, *ignored)  # type: ignore[misc]
        self.db.validate_no_broken_transaction()  # before a BEGIN is sent, as Django does
        # The pipeline's errors arrive at its end, outside Django's own wrapping.
        with self.db.wrap_database_errors, _beginning(raw):
            return super()._execute(sql, params, *ignored)  # type: ignore[misc]


class _BeginRidesCursor(_BeginRides, CursorWrapper):
    pass


class _BeginRidesDebugCursor(_BeginRides, CursorDebugWrapper):
    pass


def statement_cursor(connection: Any) -> Any:
    """The cursor for one of the framework's hot named statements on the Django
    ``connection``: :func:`preparing_cursor` where :func:`prepares`, else Django's own
    (its binding, wrappers and query log), whose statement that opens the caller's
    transaction brings psycopg's BEGIN with it, as a preparing cursor's does. One
    statement per execute: a pipeline takes no string of several."""
    connection.ensure_connection()
    if prepares(connection):
        return preparing_cursor(connection)
    # As Django's connection.cursor() makes its cursor.
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    with connection.wrap_database_errors:
        cursor = connection.create_cursor()
    if connection.queries_logged:
        return _BeginRidesDebugCursor(cursor, connection)
    return _BeginRidesCursor(cursor, connection)
