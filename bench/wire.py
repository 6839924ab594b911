"""Round trips, statements and transactions as PostgreSQL sees them, without
pg_stat_statements: a TCP proxy in front of the server that reads the wire protocol.

Every client of the process or subprocess pointed at :attr:`WireCounter.url` is counted —
Django's connections, procrastinate's pool and its LISTEN session alike, and what neither
logs (``BEGIN``, ``COMMIT``, ``SAVEPOINT``, the health check's ``SELECT 1``):

* a *round trip* is a request the client waits on: a simple ``Query`` message or the
  ``Sync`` that ends an extended-protocol batch;
* a *statement* is a simple ``Query`` or an ``Execute`` of a parsed statement;
* a *transaction* ends when the server reports the session idle after it ran a non-empty
  statement: a ``COMMIT``/``ROLLBACK`` of an explicit block, or one statement in
  autocommit (as ``pg_stat_database.xact_commit`` counts them); *commits* counts the
  explicit ``COMMIT`` statements only.

Statements are also counted by text, with literals replaced by ``?`` (client-side binding
inlines them), which gives pg_stat_statements' ``calls`` per query, and by kind: transaction
control, liveness checks (a pool's empty statement, Django's ``SELECT 1``) and work.

The proxy passes bytes through unchanged; it needs an unencrypted session
(``sslmode=disable``, which :attr:`url` sets).
"""

from __future__ import annotations

import asyncio
import collections
import re
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

#: Startup-phase request codes answered by the server with one byte (encryption offers).
_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104
_CANCEL_REQUEST = 80877102

_QUOTED = re.compile(r"'(?:[^']|'')*'")
_NUMBER = re.compile(r"(?<![\w$])-?\d+(?:\.\d+)?(?![\w$])")
_SPACE = re.compile(r"\s+")
_VALUES_LIST = re.compile(r"\((?:\s*\?\s*,)+\s*\?\s*\)")
#: Django names each savepoint after the thread and a counter: one name for them all.
_SAVEPOINT = re.compile(r'((?:RELEASE |ROLLBACK TO )?SAVEPOINT) "[^"]+"', re.IGNORECASE)


_CONTROL = ("BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE")
#: A pool's liveness check (an empty statement) and Django's health check (``SELECT 1``).
_LIVENESS = ("", "SELECT ?")


def kind(text: str) -> str:
    """``transaction control``, ``liveness check`` or ``work``, for a normalised statement."""
    if text in _LIVENESS:
        return "liveness check"
    if text.upper().startswith(_CONTROL):
        return "transaction control"
    return "work"


def normalise(text: str) -> str:
    """A statement's text with literals as ``?`` and whitespace collapsed."""
    text = _SPACE.sub(" ", _NUMBER.sub("?", _QUOTED.sub("?", text))).strip()
    return _SAVEPOINT.sub(r"\1 ?", _VALUES_LIST.sub("(?, …)", text))


@dataclass(frozen=True)
class Counts:
    round_trips: int = 0
    statements: int = 0
    transactions: int = 0
    commits: int = 0
    by_text: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: Counts) -> Counts:
        texts = collections.Counter(self.by_text)
        texts.update(other.by_text)
        return Counts(
            round_trips=self.round_trips + other.round_trips,
            statements=self.statements + other.statements,
            transactions=self.transactions + other.transactions,
            commits=self.commits + other.commits,
            by_text=dict(texts),
        )

    def __sub__(self, other: Counts) -> Counts:
        texts = collections.Counter(self.by_text)
        texts.subtract(other.by_text)
        return Counts(
            round_trips=self.round_trips - other.round_trips,
            statements=self.statements - other.statements,
            transactions=self.transactions - other.transactions,
            commits=self.commits - other.commits,
            by_text={t: n for t, n in texts.items() if n},
        )

    def per(self, units: int, *, top: int = 20) -> dict[str, Any]:
        """Counts per unit of work (a job, an admit), with the most frequent statements."""
        ranked = sorted(self.by_text.items(), key=lambda item: (-item[1], item[0]))
        kinds: collections.Counter[str] = collections.Counter()
        for text, n in self.by_text.items():
            kinds[kind(text)] += n
        return {
            "round_trips": self.round_trips / units,
            "statements": self.statements / units,
            "transactions": self.transactions / units,
            "commits": self.commits / units,
            "statements_by_kind": {k: kinds[k] / units for k in sorted(kinds)},
            "top_statements": [
                {
                    "calls_per_unit": round(n / units, 3),
                    "kind": kind(text),
                    "statement": text[:240] or "(empty statement)",
                }
                for text, n in ranked[:top]
            ],
        }


class _Session:
    """Protocol state of one client connection (prepared statements, portals, status)."""

    def __init__(self, counter: WireCounter):
        self.counter = counter
        self.prepared: dict[str, str] = {}
        self.portals: dict[str, str] = {}
        self.status = b"I"
        self.ran_statement = False

    # client → server

    def client_message(self, kind: bytes, body: bytes) -> None:
        if kind == b"Q":
            text = body.rstrip(b"\0").decode(errors="replace")
            self.counter._count(round_trip=True, statement=text)
            self.ran_statement = self.ran_statement or bool(text.strip())
        elif kind == b"P":
            name, _, rest = body.partition(b"\0")
            query, _, _ = rest.partition(b"\0")
            self.prepared[name.decode()] = query.decode(errors="replace")
        elif kind == b"B":
            portal, _, rest = body.partition(b"\0")
            statement, _, _ = rest.partition(b"\0")
            self.portals[portal.decode()] = self.prepared.get(statement.decode(), "?")
        elif kind == b"E":
            portal, _, _ = body.partition(b"\0")
            text = self.portals.get(portal.decode(), "?")
            self.counter._count(statement=text)
            # An empty statement (a pool's liveness check) runs no transaction.
            self.ran_statement = self.ran_statement or bool(text.strip())
        elif kind == b"S":
            self.counter._count(round_trip=True)

    # server → client

    def server_message(self, kind: bytes, body: bytes) -> None:
        if kind != b"Z":
            return
        status = body[:1]
        if self.ran_statement and status == b"I":
            self.counter._count(transaction=True)
        self.ran_statement = False
        self.status = status


async def open_server(
    params: Mapping[str, Any],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A stream to the PostgreSQL server of libpq ``params``: over its Unix socket when
    ``host`` is a directory (as libpq reads it; the embedded server's), else over TCP."""
    host = str(params.get("host") or "/var/run/postgresql")
    port = int(params.get("port") or 5432)
    if host.startswith("/"):
        return await asyncio.open_unix_connection(f"{host}/.s.PGSQL.{port}")
    return await asyncio.open_connection(host, port)


class WireCounter:
    """A counting proxy on ``127.0.0.1:<port>`` in front of the server of ``params``
    (psycopg connection parameters: host — a name or a socket directory — port, user,
    password, dbname). Runs its own event loop in a daemon thread."""

    def __init__(self, params: Mapping[str, Any]):
        self._params = dict(params)
        self._lock = threading.Lock()
        self._texts: collections.Counter[str] = collections.Counter()
        self._round_trips = self._statements = self._transactions = self._commits = 0
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.port = 0

    # counting (called on the proxy's thread)

    def _count(
        self, *, round_trip: bool = False, statement: str | None = None, transaction: bool = False
    ) -> None:
        with self._lock:
            if round_trip:
                self._round_trips += 1
            if statement is not None:
                self._statements += 1
                text = normalise(statement)
                self._texts[text] += 1
                if text.upper() in {"COMMIT", "COMMIT TRANSACTION", "END"}:
                    self._commits += 1
            if transaction:
                self._transactions += 1

    def snapshot(self) -> Counts:
        with self._lock:
            return Counts(
                round_trips=self._round_trips,
                statements=self._statements,
                transactions=self._transactions,
                commits=self._commits,
                by_text=dict(self._texts),
            )

    # life cycle

    def __enter__(self) -> WireCounter:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = future.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    @property
    def connection_params(self) -> dict[str, Any]:
        """The original parameters, pointed at the proxy."""
        return {
            **self._params,
            "host": "127.0.0.1",
            "port": self.port,
            "sslmode": "disable",
            "gssencmode": "disable",
        }

    @property
    def url(self) -> str:
        """A ``DATABASE_URL`` that goes through the proxy."""
        user = quote(str(self._params.get("user") or ""))
        password = self._params.get("password")
        auth = f"{user}:{quote(str(password))}" if password else user
        dbname = quote(str(self._params["dbname"]))
        return (
            f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}?sslmode=disable&gssencmode=disable"
        )

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await open_server(self._params)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = _Session(self)
        try:
            up_reader, up_writer = await self._open_upstream()
        except OSError:
            writer.close()
            return
        try:
            if await self._startup(reader, writer, up_reader, up_writer):
                pumps = [
                    asyncio.create_task(self._pump(reader, up_writer, session.client_message)),
                    asyncio.create_task(self._pump(up_reader, writer, session.server_message)),
                ]
                try:
                    await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for pump in pumps:
                        pump.cancel()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            # Cancelled when the counter closes: end quietly (the stream callback would
            # report a cancelled handler as an error).
            pass
        finally:
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _startup(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        up_reader: asyncio.StreamReader,
        up_writer: asyncio.StreamWriter,
    ) -> bool:
        """Forward the untyped startup messages; False for a cancel request (no session).
        An encryption offer is answered with one byte (``N``: refused, as sslmode=disable
        never asks)."""
        while True:
            header = await reader.readexactly(4)
            (length,) = struct.unpack("!i", header)
            body = await reader.readexactly(length - 4)
            (code,) = struct.unpack("!i", body[:4])
            up_writer.write(header + body)
            await up_writer.drain()
            if code == _CANCEL_REQUEST:
                return False
            if code not in (_SSL_REQUEST, _GSSENC_REQUEST):
                return True
            writer.write(await up_reader.readexactly(1))
            await writer.drain()

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_message: Callable[[bytes, bytes], None],
    ) -> None:
        """Forward bytes as they come; each complete message is counted before it is
        passed on, so a client that saw its answer also sees it counted."""
        buffer = bytearray()
        try:
            while chunk := await reader.read(65536):
                buffer += chunk
                while len(buffer) >= 5:
                    (length,) = struct.unpack_from("!i", buffer, 1)
                    if len(buffer) < 1 + length:
                        break
                    on_message(bytes(buffer[:1]), bytes(buffer[5 : 1 + length]))
                    del buffer[: 1 + length]
                writer.write(chunk)
                await writer.drain()
        except (ConnectionError, OSError):
            return
