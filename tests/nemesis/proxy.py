"""A TCP proxy in front of one worker's database connections, able to cut and to partition.

One asyncio loop (a thread of the runner) serves every proxy. Two faults:

- :meth:`Proxy.reset` closes every connection through it with an RST (``SO_LINGER`` 0) on
  both sides: the worker and the server see the connection die, as after a server crash or
  a firewall's reset;
- :meth:`Proxy.partition` stops forwarding in both directions *without closing anything*:
  bytes already read wait in the proxy, nothing more is read, and new connections are
  accepted but not forwarded. The worker's sockets stay open and healthy at the TCP level
  (the proxy's kernel acknowledges them), so TCP keepalives and ``tcp_user_timeout`` see
  nothing: only a timeout of the worker's own notices. :meth:`Proxy.heal` forwards again,
  the held bytes first.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
from collections.abc import Callable


class ProxyLoop:
    """The event loop thread all proxies of a run share."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="proxy")
        self._thread.start()

    def call(self, func: Callable[[], object], timeout: float = 30) -> object:
        """Run ``func`` (a coroutine function or a plain one) on the loop and wait for it."""

        async def run() -> object:
            result = func()
            if asyncio.iscoroutine(result):
                result = await result
            return result

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)


class Proxy:
    """127.0.0.1:``port`` → ``upstream_port`` (thread-safe: every method posts to the loop)."""

    def __init__(self, loop: ProxyLoop, *, upstream_port: int, name: str) -> None:
        self._loop = loop
        self.name = name
        self.upstream_port = upstream_port
        self._forwarding = asyncio.Event()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter | None]] = set()
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    def start(self) -> int:
        async def start() -> int:
            self._forwarding.set()
            self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
            return self._server.sockets[0].getsockname()[1]

        self.port = int(self._loop.call(start))
        return self.port

    @property
    def partitioned(self) -> bool:
        return not self._forwarding.is_set()

    def partition(self) -> None:
        self._loop.call(self._forwarding.clear)

    def heal(self) -> None:
        self._loop.call(self._forwarding.set)

    def reset(self) -> int:
        """RST every connection through the proxy; returns how many."""

        def reset() -> int:
            pairs = list(self._pairs)
            for pair in pairs:
                for writer in pair:
                    if writer is not None:
                        _abort(writer)
            self._pairs.clear()
            return len(pairs)

        return int(self._loop.call(reset))

    def connections(self) -> int:
        return int(self._loop.call(lambda: len(self._pairs)))

    def close(self) -> None:
        def close() -> None:
            if self._server is not None:
                self._server.close()
            for pair in list(self._pairs):
                for writer in pair:
                    if writer is not None:
                        _abort(writer)
            self._pairs.clear()

        self._loop.call(close)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None] = (writer, None)
        self._pairs.add(pair)
        try:
            await self._forwarding.wait()
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            _abort(writer)
            self._pairs.discard(pair)
            return
        if pair not in self._pairs:  # reset while it connected
            _abort(up_writer)
            return
        self._pairs.discard(pair)
        pair = (writer, up_writer)
        self._pairs.add(pair)
        await asyncio.gather(
            self._pipe(reader, up_writer, pair), self._pipe(up_reader, writer, pair)
        )
        self._pairs.discard(pair)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter | None],
    ) -> None:
        try:
            while True:
                await self._forwarding.wait()
                data = await reader.read(65536)
                if not data:
                    break
                # A partition that began while this read waited holds the bytes read.
                await self._forwarding.wait()
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for other in pair:
                if other is not None and not other.is_closing():
                    other.close()


def _abort(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
