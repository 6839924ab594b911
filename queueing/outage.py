"""Failure windows for the worker's loops: back off, say so, and give up in time.

Each of the worker's loops (fetching, heart-beating, saving an outcome, deferring periodic
jobs, maintenance) reports its failures and successes under its own name. A failure
returns the delay before the next attempt and is logged as one line with that delay:
capped exponential backoff with full jitter, capped at ``RECONNECT_SECONDS`` while the
database is out of reach (a refused or lost connection costs the database nothing, and the
worker must be back within a second of the database), at ``CAP_SECONDS`` for other errors.

Any successful round trip of a loop ends its failure streak (:meth:`Failures.recovered`):
a fetch that finds a job counts as much as one that finds none, so between faults the
worker runs at full speed, and a storm of terminated connections over a backlog never adds
up to an outage. A loop that has failed without a break for the whole window gives the
worker up — unless the database answered the worker meanwhile: any loop's successful
round trip (:meth:`Failures.answered`) within the window, its heartbeat's own connection
beating lately (``reachable``), or, last, one round trip of the worker's own at the moment
it would give up (``on_expired`` decides): a worker never exits while its database is
reachable, however two outages and their short gap fall on its loops. One loop's success
does not hide another's endless failure of any other kind (a heartbeat that works must not
keep a worker alive whose fetch always errs).

A database that refuses the worker for good — an authentication failure (SQLSTATE 28P01,
28000) or a database that does not exist (3D000) — is no outage: the worker stops at
once, at its start or at a loop's first refusal, saying what to fix (:func:`refusal`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg_pool

from queueing import backoff

logger = logging.getLogger("queueing.worker")

#: Backoff between attempts: full jitter from 0.5 s, growing to at most 10 s ...
BASE_SECONDS = 0.5
CAP_SECONDS = 10.0
#: ... and to at most 1 s while the database is out of reach.
RECONNECT_SECONDS = 1.0
MIN_PAUSE_SECONDS = 0.05


def beat_resume_seconds(heartbeat: float) -> float:
    """The liveness bound: at most this long after the database accepts connections
    again, a live worker's heartbeat lands — its next attempt, which comes every
    ``RECONNECT_SECONDS`` while the database is away (every heartbeat, when that is
    shorter), on a connection of its own (``queueing.worker``). Stalled recovery's resume
    gap is derived from it (``queueing.sweeps.Sweep.resume_gap_seconds``)."""
    return min(heartbeat, RECONNECT_SECONDS)


class DatabaseRefused(psycopg.OperationalError):
    """The database refuses this worker for good: its connection settings are wrong (a
    role, password or database that the server does not know), which no outage window
    mends. The message says what to fix."""


#: What the server says when it refuses a client for good (SQLSTATE 28P01, 28000, 3D000,
#: and libpq's own word for a password the server asks for and the settings lack), and
#: what to fix. Read from the connection's error message: libpq gives no SQLSTATE for a
#: failed connection. PostgreSQL's English messages: a server whose ``lc_messages``
#: translates them is taken for out of reach, and the worker waits out its window. An
#: authentication the server delegates (LDAP, RADIUS, PAM, GSSAPI, SSPI, Ident) is no
#: refusal: the client cannot tell a wrong password from the service being down.
_REFUSALS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"password authentication failed for user"),
        "28P01",
        "the password of the connection settings is wrong",
    ),
    (
        re.compile(r'role "[^"]*" does not exist'),
        "28000",
        "the role (user) of the connection settings does not exist on the server",
    ),
    (
        re.compile(r"no pg_hba\.conf entry|pg_hba\.conf rejects connection"),
        "28000",
        "the server's pg_hba.conf admits no such connection (host, role, database)",
    ),
    (
        # Only the methods the server decides alone (peer, certificate). One it delegates
        # (LDAP, RADIUS, PAM, GSSAPI, SSPI, Ident, BSD) fails in the same words when the
        # service it asks is down: that is an outage (auth_failed in PostgreSQL's auth.c).
        re.compile(
            r'(?:Peer|certificate|"trust") authentication failed for user'
            r'|authentication failed for user "[^"]*": invalid authentication method'
            r"|is not permitted to log in"
        ),
        "28000",
        "the server does not let this role log in",
    ),
    (
        re.compile(r'database "[^"]*" does not exist'),
        "3D000",
        "the database of the connection settings does not exist on the server",
    ),
    (
        re.compile(r"no password supplied"),
        "28P01",
        "the server asks for a password and the connection settings have none",
    ),
)


def refusal(exc: BaseException) -> str | None:
    """What to fix when ``exc`` (or an error it wraps) is the database refusing this
    client for good — an authentication failure (SQLSTATE 28P01, 28000) or a database
    that does not exist (3D000) — and not an outage; None otherwise."""
    seen: set[int] = set()
    error: BaseException | None = exc
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, psycopg.Error):
            text = str(error)
            for pattern, sqlstate, fix in _REFUSALS:
                if (error.sqlstate or sqlstate) == sqlstate and pattern.search(text):
                    detail = text.strip().splitlines()[0].rpartition("FATAL:")[2].strip()
                    return (
                        f"the database refuses this worker (SQLSTATE {sqlstate}: {detail}): "
                        f"{fix}. Fix the database settings (DATABASES['default']); this is no "
                        "outage, and waiting would not mend it"
                    )
        error = error.__cause__ or error.__context__
    return None


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver error it wraps) means the database is out of reach:
    a refused or lost connection, a shutdown, a pool with nothing to give."""
    cause = exc.__cause__ or exc
    return isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError | OSError)


#: What the database says when the code is newer than its schema: a release started
#: before its migrations ran (docs/deploy.md, rolling a deploy).
SCHEMA_BEHIND = (
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
)


def describe(exc: BaseException) -> str:
    """``exc`` (or what caused it) in one line: its type and the first line of its message,
    and what to do when the database's schema is older than the code."""
    cause = exc.__cause__ or exc
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    line = f"{type(cause).__name__}: {text}" if text else type(cause).__name__
    if isinstance(cause, SCHEMA_BEHIND):
        line += " (is the database migrated? run `manage.py migrate`)"
    return line


def pause_after(attempt: int, *, unreachable: bool, rng: random.Random) -> float:
    """The pause after ``attempt`` (0-based) failed attempts in a row: full jitter, capped
    at ``RECONNECT_SECONDS`` when the database is out of reach, else at ``CAP_SECONDS``."""
    cap = RECONNECT_SECONDS if unreachable else CAP_SECONDS
    return max(MIN_PAUSE_SECONDS, backoff.delay(attempt, base=BASE_SECONDS, cap=cap, rng=rng))


class Failures:
    """Per-loop failure windows, shared by one worker (one event loop: not thread-safe)."""

    def __init__(
        self,
        *,
        window: float,
        on_expired: Callable[..., None],
        reachable: Callable[[], bool] = lambda: False,
    ):
        self.window = window
        self._on_expired = on_expired
        self._reachable = reachable
        self._since: dict[str, float] = {}
        self._attempts: dict[str, int] = {}
        self._rng = random.SystemRandom()
        self.expired = False
        #: When any loop's round trip last succeeded (monotonic clock).
        self._answered_at = float("-inf")
        #: Bumped by every failure: job threads reconnect once when it moved.
        self.epoch = 0

    def failed(self, loop: str, exc: BaseException, *, bounded: bool = True) -> float:
        """Record a failed attempt of ``loop``; return the pause before the next one.
        ``bounded=False`` for a loop the worker can do without (LISTEN: polling remains)."""
        now = time.monotonic()
        self.epoch += 1
        since = self._since.setdefault(loop, now)
        attempt = self._attempts.get(loop, 0)
        self._attempts[loop] = attempt + 1
        elapsed = now - since
        refused = refusal(exc)
        if refused is not None and not self.expired:
            # Not an outage: its settings are wrong, and no window would mend them.
            self.expired = True
            self._on_expired(f"{refused} (while {loop})", unreachable=False)
        unreachable = is_connection_error(exc) and refused is None
        # Unreachable for the whole window means no round trip of any loop got through in
        # it: a loop that made no attempt in a short gap between two outages does not
        # count both as one.
        unanswered = now - max(since, self._answered_at) if unreachable else elapsed
        if bounded and unanswered >= self.window and not self.expired:
            if unreachable and self._reachable():
                # The database answers the worker (its heartbeat beat lately): this loop
                # waits on a connection that is coming, not on an outage.
                logger.warning(
                    "%s has failed for %.0f s, but the database answers: not giving up",
                    loop,
                    elapsed,
                )
                self._since[loop] = now
            else:
                self.expired = True
                trouble = "the database stayed unreachable" if unreachable else "it kept failing"
                self._on_expired(
                    f"{trouble} while {loop} for {elapsed:.0f} s (the window is "
                    f"{self.window:.0f} s, QUEUEING_DATABASE_OUTAGE_SECONDS); last error: "
                    f"{describe(exc)}",
                    unreachable=unreachable,
                )
        pause = pause_after(attempt, unreachable=unreachable, rng=self._rng)
        logger.log(
            logging.WARNING if unreachable else logging.ERROR,
            "%s while %s (attempt %d, failing for %.0f s): %s; next attempt in %.1f s",
            "database unreachable" if unreachable else "database error",
            loop,
            attempt + 1,
            elapsed,
            describe(exc),
            pause,
        )
        return pause

    def failing(self, loop: str) -> bool:
        """Whether ``loop``'s last attempt failed."""
        return loop in self._attempts

    def answered(self) -> None:
        """The database answered a round trip (any loop's, the heartbeat's, a probe's)."""
        self._answered_at = time.monotonic()

    def reprieve(self) -> None:
        """The worker was about to give up, but its database answers: carry on."""
        self.answered()
        self.expired = False

    def recovered(self, loop: str) -> None:
        """A round trip of ``loop`` succeeded: its failure streak, if any, is over."""
        self.answered()
        since = self._since.pop(loop, None)
        if self._attempts.pop(loop, 0) and since is not None:
            logger.warning("%s works again after %.1f s", loop, time.monotonic() - since)


class WorkerPool(psycopg_pool.AsyncConnectionPool):
    """The worker's pool (procrastinate's ``pool_factory``), whose opening waits for the
    database as long as the outage window, not the pool's 30 s, and which lends a live
    connection as soon as it has one, however many dead ones it held.

    procrastinate opens its pool with ``wait=True`` before the worker starts: a worker
    started while the database was away exited after 30 s, and even seconds after the
    database returned, since the pool's attempts back off, doubling. Here the database is
    tried first on a plain connection of its own, at most ``RECONNECT_SECONDS`` apart, for
    ``window`` seconds (``QUEUEING_DATABASE_OUTAGE_SECONDS``; then its error is raised and
    the worker exits non-zero); once one gets through, the pool opens at once.

    A lent connection is checked (``check``) here, not by psycopg_pool: its loop sleeps 1,
    2, 4 … s after each connection that fails the check before it takes the next one. After
    a restart every idle connection is dead, so a pool of four lent its first live
    connection some 7 s after the database's return — past the worker's 5 s pool timeout,
    which failed the fetch, and jobs started 6 s late, whenever nothing had cleared the
    pool first (a worker whose LISTEN and heartbeat connected after the restart, its pool
    before: one started during a deploy). Here a connection that fails the check is
    handed back at once (the pool replaces it) and the next one is taken without a pause:
    each needs a connection that exists, so this never spins."""

    def __init__(
        self,
        *args: Any,
        window: float,
        check: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ):
        self.window = window
        #: The check of each lent connection (psycopg_pool's ``check``, applied by getconn).
        self.lent_check = check
        super().__init__(*args, **kwargs)

    async def getconn(self, timeout: float | None = None) -> Any:
        if timeout is None:
            timeout = self.timeout
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise psycopg_pool.PoolTimeout(f"couldn't get a connection after {timeout:.2f} sec")
            connection = await super().getconn(remaining)
            if self.lent_check is None:
                return connection
            try:
                await self.lent_check(connection)
            except Exception as exc:
                # Closed here if the check left it open: the pool discards it, opens another.
                logger.debug("a pooled connection failed its check: %s", describe(exc))
                await connection.close()
                await self.putconn(connection)
                continue
            except BaseException:
                await self.putconn(connection)
                raise
            return connection

    async def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        if wait:
            conninfo, kwargs = await _resolved(self.conninfo), await _resolved(self.kwargs)
            await wait_for_database(conninfo, kwargs or {}, window=self.window)
        await super().open(wait=wait, timeout=timeout)


async def _resolved(value: Any) -> Any:
    """A pool's ``conninfo`` or ``kwargs``: the value, or what its callable (sync or
    async, as psycopg_pool accepts) returns."""
    if callable(value):
        value = value()
        if inspect.isawaitable(value):
            value = await value
    return value


async def wait_for_database(conninfo: str, kwargs: dict[str, Any], *, window: float) -> None:
    """Return once the database accepts a connection; raise the last connection error when
    none did within ``window`` seconds. Attempts are ``RECONNECT_SECONDS`` apart."""
    deadline = time.monotonic() + window
    attempts = 0
    while True:
        try:
            connection = await psycopg.AsyncConnection.connect(conninfo, **kwargs)
        except psycopg.OperationalError as exc:
            refused = refusal(exc)
            if refused is not None:
                logger.error("the worker cannot start: %s", refused)
                raise DatabaseRefused(refused) from exc
            attempts += 1
            if time.monotonic() + RECONNECT_SECONDS > deadline:
                logger.error(
                    "the database stayed out of reach for %.0f s "
                    "(QUEUEING_DATABASE_OUTAGE_SECONDS): %s",
                    window,
                    describe(exc),
                )
                raise
            if attempts == 1:
                logger.warning(
                    "the database is out of reach: the worker starts once it answers, "
                    "trying every %.0f s for %.0f s (%s)",
                    RECONNECT_SECONDS,
                    window,
                    describe(exc),
                )
            await asyncio.sleep(RECONNECT_SECONDS)
        else:
            await connection.close()
            if attempts:
                logger.warning("the database answers after %d attempts: starting", attempts)
            return
