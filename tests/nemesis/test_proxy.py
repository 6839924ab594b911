"""The nemesis proxy against an echo server: it forwards, a partition holds bytes without
closing anything (half-open), healing delivers them, and a reset ends the connection."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator

import pytest

from tests.nemesis.proxy import Proxy, ProxyLoop


class Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    loop = ProxyLoop()
    proxy = Proxy(loop, upstream_port=server.server_address[1], name="test")
    proxy.start()
    yield proxy
    proxy.close()
    loop.stop()
    server.shutdown()
    server.server_close()


def connect(proxy: Proxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    sock.sendall(b"hello")
    assert sock.recv(100) == b"hello"
    return sock


def test_a_partition_holds_bytes_both_ways_until_it_heals(proxy):
    sock = connect(proxy)
    proxy.partition()
    sock.sendall(b"lost?")
    sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        sock.recv(100)
    # Half-open: nothing was closed, a new connection is accepted but not forwarded.
    other = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
    other.sendall(b"late")
    proxy.heal()
    sock.settimeout(10)
    assert sock.recv(100) == b"lost?"
    other.settimeout(10)
    assert other.recv(100) == b"late"
    sock.close()
    other.close()


def test_a_reset_ends_every_connection(proxy):
    sock = connect(proxy)
    assert proxy.reset() == 1
    with pytest.raises((ConnectionResetError, BrokenPipeError)):
        sock.sendall(b"more")
        if sock.recv(100) == b"":
            raise ConnectionResetError("closed")
    sock.close()
    connect(proxy).close()
