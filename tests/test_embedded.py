"""The fresh-machine path: with DATABASE_URL unset, pgstage starts its own PostgreSQL.

CI runs with DATABASE_URL set, so this test boots the embedded server itself, in a
temporary data directory, and connects to the database it reports."""

from __future__ import annotations

import os
import signal
import time

import psycopg
import pytest

from config.embedded import DATABASE_NAME, embedded_database_url

pytestmark = pytest.mark.slow


def test_embedded_server_starts_creates_the_database_and_is_reused(tmp_path):
    data_dir = tmp_path / "pg"
    url = embedded_database_url(data_dir)
    try:
        with psycopg.connect(url) as conn:
            assert conn.info.dbname == DATABASE_NAME
            assert conn.execute("SELECT 1").fetchone() == (1,)
        # A second process (a worker) finds the running server: same URL, no new server.
        pid = (data_dir / "postmaster.pid").read_text().split()[0]
        assert embedded_database_url(data_dir) == url
        assert (data_dir / "postmaster.pid").read_text().split()[0] == pid
    finally:
        pid_file = data_dir / "postmaster.pid"
        if pid_file.exists():
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
            deadline = time.monotonic() + 20
            while pid_file.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
