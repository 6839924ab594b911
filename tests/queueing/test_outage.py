"""The worker's start while the database is away (queueing.outage.WorkerPool).

procrastinate opens the worker's pool before the worker runs, waiting 30 s at most: a worker
started (by a deploy, by its supervisor after a crash) while the database was away exited,
even seconds after the database came back. Here the database refuses connections (nothing
listens on its port) and then answers (a forwarder to the test database starts listening).
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

from queueing.outage import WorkerPool

pytestmark = pytest.mark.django_db


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
        upstream_reader, upstream_writer = await asyncio.open_connection(
            params.get("host") or "127.0.0.1", int(params.get("port") or 5432)
        )

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


def test_a_plain_pool_gives_up_after_its_own_wait():
    """What procrastinate's own pool does in the same scenario: the worker exits."""

    async def scenario() -> None:
        async with database_back_after(2.5) as params:
            pool = psycopg_pool.AsyncConnectionPool(kwargs=params, min_size=1, open=False)
            await pool.open(wait=True, timeout=1.0)

    with pytest.raises(psycopg_pool.PoolTimeout):
        asyncio.run(scenario())


def test_the_worker_pool_gives_up_after_the_outage_window():
    params = {**connector_params(), "host": "127.0.0.1", "port": free_port()}

    async def scenario() -> None:
        await WorkerPool(kwargs=params, min_size=1, open=False, window=1.5).open(wait=True)

    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        asyncio.run(scenario())
    assert time.monotonic() - started < 3.5


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
