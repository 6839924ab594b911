"""The outage window (``queueing.outage.Failures``) and the worker's last check before it
gives up (``PgstageWorker._give_up``).

Fault model — a worker must stop only when its database stayed out of reach for the whole
window (``QUEUEING_DATABASE_OUTAGE_SECONDS``):
- two outages with a short gap, one loop making no attempt in the gap while others get
  through: test_a_round_trip_of_any_loop_breaks_an_outage (before the fix: the loop's
  streak spanned both outages and the worker stopped;
  tests/acceptance/test_database_outage.py::
  test_an_outage_ending_at_the_window_never_stops_a_worker_whose_database_is_back
  reproduces it with a real server);
- a loop's attempt begun in the outage reports its failure after the database is back,
  before any round trip got through: test_the_worker_stops_only_if_its_own_round_trip_fails;
- a loop that fails with errors other than unreachable while others work still stops the
  worker: test_other_errors_are_not_excused_by_other_loops_round_trips;
- an outage ending just short of the window, or lasting exactly as long:
  test_an_outage_exactly_as_long_as_the_window_stops_the_worker;
- a worker started while the database is away (queueing.outage.WorkerPool): procrastinate
  opens the worker's pool before the worker runs, waiting 30 s at most, so a worker started
  (by a deploy, by its supervisor after a crash) while the database was away exited, even
  seconds after the database came back. Here the database refuses connections (nothing
  listens on its port) and then answers (a forwarder to the test database starts listening).
- every idle connection of the worker's pool ended by the server (a restart) before anything
  cleared them: test_a_pool_of_dead_connections_lends_a_live_one_at_once (before the fix:
  psycopg_pool slept 1, 2, 4 … s after each one that failed the check, the worker's fetch
  timed out after 5 s, and jobs started some 6 s after the database's return).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import psycopg
import psycopg_pool
import pytest
from procrastinate.contrib.django import app as procrastinate_app
from procrastinate.contrib.django.utils import connector_params

from queueing import outage
from queueing.connector import _autocommit, _check
from queueing.outage import WorkerPool

REFUSED = psycopg.OperationalError("connection refused")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(outage.time, "monotonic", clock)
    return clock


def _failures(expired: list[str]) -> outage.Failures:
    return outage.Failures(window=4, on_expired=lambda reason, **_: expired.append(reason))


def test_a_round_trip_of_any_loop_breaks_an_outage(clock):
    expired: list[str] = []
    failures = _failures(expired)
    failures.failed("beating", REFUSED)
    clock.now += 2.5  # the first outage ends; the fetch loop gets through, the heartbeat
    failures.recovered("fetching jobs")  # makes no attempt before the second one begins
    clock.now += 0.5
    failures.failed("beating", REFUSED)
    clock.now += 1.5  # 4.5 s into the beat's streak, 2 s since the database answered
    failures.failed("beating", REFUSED)
    assert expired == [] and not failures.expired
    clock.now += 2.1  # 4.1 s without an answer
    failures.failed("beating", REFUSED)
    assert len(expired) == 1 and "while beating for 7 s" in expired[0]


def test_other_errors_are_not_excused_by_other_loops_round_trips(clock):
    expired: list[str] = []
    failures = _failures(expired)
    broken = psycopg.errors.UndefinedTable("relation does not exist")
    failures.failed("deferring periodic jobs", broken)
    clock.now += 3
    failures.recovered("beating")
    clock.now += 1.5
    failures.failed("deferring periodic jobs", broken)
    assert len(expired) == 1 and "it kept failing" in expired[0]


@pytest.mark.django_db(transaction=True)
def test_the_worker_stops_only_if_its_own_round_trip_fails(monkeypatch):
    from procrastinate.contrib.django import app

    from queueing import worker as worker_module
    from queueing.worker import PgstageWorker

    async def give_up(params: dict) -> PgstageWorker:
        worker = PgstageWorker(app=app, wait=True, listen_notify=False)
        monkeypatch.setattr(worker_module, "connector_params", lambda: params)
        worker.failures.expired = True
        worker._give_up("the database stayed unreachable while fetching", unreachable=True)
        await worker._probe
        return worker

    params = worker_module.connector_params()
    answered = asyncio.run(give_up(params))
    assert answered._gave_up is None and not answered.failures.expired
    closed = {**params, "host": "127.0.0.1", "port": 9, "connect_timeout": 1}
    away = asyncio.run(give_up(closed))
    assert away._gave_up == "the database stayed unreachable while fetching"


@pytest.mark.parametrize(("unanswered", "stops"), [(3.99, False), (4.0, True)])
def test_an_outage_exactly_as_long_as_the_window_stops_the_worker(clock, unanswered, stops):
    """The window is inclusive, to the instant: just short of it the loop goes on."""
    expired: list[str] = []
    failures = _failures(expired)
    failures.failed("fetching jobs", REFUSED)
    clock.now += unanswered
    failures.failed("fetching jobs", REFUSED)
    assert bool(expired) == stops


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def database_back_after(seconds: float):
    """A port that refuses connections for ``seconds``, then forwards to the database.
    Yields the connection parameters that go through it."""
    params = connector_params()
    port = free_port()

    async def forward(reader, writer) -> None:
        from bench.wire import open_server

        upstream_reader, upstream_writer = await open_server(params)

        async def pipe(source, sink) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            sink.close()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    async def listen_later() -> asyncio.Server:
        await asyncio.sleep(seconds)
        return await asyncio.start_server(forward, "127.0.0.1", port)

    starting = asyncio.create_task(listen_later())
    try:
        yield {**params, "host": "127.0.0.1", "port": port}
    finally:
        server = await starting
        server.close()


@pytest.mark.django_db
def test_the_worker_pool_opens_once_the_database_answers_past_the_pools_own_wait():
    async def scenario() -> float:
        async with database_back_after(2.5) as params:
            pool = WorkerPool(kwargs=params, min_size=1, open=False, window=30)
            started = time.monotonic()
            # procrastinate's opening (a 1 s wait here, 30 s in procrastinate).
            await pool.open(wait=True, timeout=1.0)
            opened = time.monotonic() - started
            async with pool.connection() as connection:
                await connection.execute("SELECT 1")
            await pool.close()
            return opened

    opened = asyncio.run(scenario())
    # It opened within a second of the database's return (attempts 1 s apart).
    assert 2.5 <= opened < 4.5


@pytest.mark.django_db
def test_a_plain_pool_gives_up_after_its_own_wait():
    """What procrastinate's own pool does in the same scenario: the worker exits."""

    async def scenario() -> None:
        async with database_back_after(2.5) as params:
            pool = psycopg_pool.AsyncConnectionPool(kwargs=params, min_size=1, open=False)
            await pool.open(wait=True, timeout=1.0)

    with pytest.raises(psycopg_pool.PoolTimeout):
        asyncio.run(scenario())


@pytest.mark.django_db
def test_the_worker_pool_gives_up_after_the_outage_window():
    params = {**connector_params(), "host": "127.0.0.1", "port": free_port()}

    async def scenario() -> None:
        await WorkerPool(kwargs=params, min_size=1, open=False, window=1.5).open(wait=True)

    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        asyncio.run(scenario())
    assert time.monotonic() - started < 3.5


@pytest.mark.django_db
def test_the_worker_command_opens_a_worker_pool():
    """``manage.py procrastinate worker`` opens ``app.connector.get_worker_connector()``."""

    async def scenario() -> type:
        connector = procrastinate_app.connector.get_worker_connector()
        await connector.open_async()
        try:
            return type(connector.pool)
        finally:
            await connector.close_async()

    assert asyncio.run(scenario()) is WorkerPool


@pytest.mark.parametrize(
    ("message", "sqlstate"),
    [
        ('FATAL:  password authentication failed for user "app"', "28P01"),
        ('FATAL:  role "app" does not exist', "28000"),
        ('FATAL:  no pg_hba.conf entry for host "10.0.0.5", user "app", database "app"', "28000"),
        ('FATAL:  database "app" does not exist', "3D000"),
        ("fe_sendauth: no password supplied", "28P01"),
    ],
)
def test_a_running_workers_loop_refused_by_the_database_stops_it_at_once(clock, message, sqlstate):
    """Refused mid-run (a password rotated under a running worker, a database dropped): no
    outage window mends it, so the worker stops at its first refusal, saying what to fix."""
    expired: list[str] = []
    failures = _failures(expired)
    refused = psycopg.OperationalError(
        f'connection failed: connection to server at "127.0.0.1", port 5432 failed: {message}'
    )
    failures.failed("beating", refused)
    assert len(expired) == 1 and f"SQLSTATE {sqlstate}" in expired[0]
    assert "DATABASES" in expired[0] and "while beating" in expired[0]


@pytest.mark.parametrize(
    "message",
    [
        "connection refused",
        "FATAL:  the database system is starting up",
        "FATAL:  the database system is shutting down",
        "FATAL:  sorry, too many clients already",
        "server closed the connection unexpectedly",
    ],
)
def test_an_outage_is_no_refusal(clock, message):
    expired: list[str] = []
    failures = _failures(expired)
    failures.failed("beating", psycopg.OperationalError(message))
    assert expired == [] and outage.refusal(psycopg.OperationalError(message)) is None


@pytest.mark.django_db
def test_a_pool_of_dead_connections_lends_a_live_one_at_once():
    """A restart ends every idle connection of the worker's pool; the first loop to ask
    for one gets a live one without waiting out psycopg_pool's backoff between the dead
    (1, 2, 4 … s: a pool of four took 7 s, past the worker's pool timeout)."""
    params = {**connector_params(), "application_name": "pgstage-dead-pool"}

    def pooled_backends() -> int:
        with psycopg.connect(**connector_params(), autocommit=True) as admin:
            [(count,)] = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                [params["application_name"]],
            ).fetchall()
            return count

    async def scenario() -> list[str]:
        pool = WorkerPool(
            kwargs=params, min_size=4, check=_check, configure=_autocommit, open=False, window=5
        )
        await pool.open(wait=True)
        try:
            with psycopg.connect(**connector_params(), autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    [params["application_name"]],
                )
            while pooled_backends():
                await asyncio.sleep(0.05)
            # A timeout the old loop could not meet: it slept 1 s, then 2 s, between the
            # dead connections, and gave up on the fourth.
            async with pool.connection(timeout=3.0) as connection:
                rows = await connection.execute("SELECT current_setting('application_name')")
                return [row[0] for row in await rows.fetchall()]
        finally:
            await pool.close()

    assert asyncio.run(scenario()) == ["pgstage-dead-pool"]


@pytest.mark.parametrize("method", ["LDAP", "RADIUS", "PAM", "GSSAPI", "SSPI", "Ident", "BSD"])
def test_an_authentication_service_out_of_reach_is_no_refusal(clock, method):
    """PostgreSQL answers a client whose authentication it delegates (an LDAP or RADIUS
    server, PAM, Kerberos, an ident daemon) with the same words whether the password is
    wrong or that service is down (``auth_failed`` in src/backend/libpq/auth.c, SQLSTATE
    28000): the reason is in the server's log only. A blip of the directory server while
    the workers reconnect (after a restart) is an outage: stopping every worker at its
    first refusal would turn it into one of the whole fleet."""
    message = (
        'connection failed: connection to server at "127.0.0.1", port 5432 failed: '
        f'FATAL:  {method} authentication failed for user "app"'
    )
    expired: list[str] = []
    failures = _failures(expired)
    failures.failed("beating", psycopg.OperationalError(message))
    assert expired == [] and outage.refusal(psycopg.OperationalError(message)) is None
    # Its window still applies: unanswered for the whole of it, the worker gives up.
    clock.now += 5
    failures.failed("beating", psycopg.OperationalError(message))
    assert len(expired) == 1 and "unreachable" in expired[0]


@pytest.mark.parametrize("method", ["Peer", "certificate"])
def test_a_local_authentication_failure_is_a_refusal(clock, method):
    message = f'FATAL:  {method} authentication failed for user "app"'
    assert outage.refusal(psycopg.OperationalError(message)) is not None


@pytest.mark.django_db
def test_an_error_of_a_schema_older_than_the_code_says_to_migrate():
    """A worker of a release started before its migrations (the fetch function missing)
    logs, on every failed attempt, what to do; other errors read as before."""
    from procrastinate.exceptions import ConnectorException

    def raised(statement: str) -> BaseException:
        with psycopg.connect(**connector_params(), autocommit=True) as conn:
            try:
                conn.execute(statement)
            except psycopg.Error as error:
                try:
                    raise ConnectorException() from error
                except ConnectorException as wrapped:
                    return wrapped
        raise AssertionError(f"{statement} did not fail")

    missing = outage.describe(raised("SELECT pgstage_fetch_job_v0()"))
    assert missing.startswith("UndefinedFunction: function pgstage_fetch_job_v0() does not exist")
    assert missing.endswith("(is the database migrated? run `manage.py migrate`)")
    assert "migrate" in outage.describe(raised("SELECT * FROM pgstage_no_such_table"))
    assert outage.describe(raised("SELECT 1 / 0")) == "DivisionByZero: division by zero"
