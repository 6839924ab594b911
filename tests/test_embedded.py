"""The fresh-machine path: with DATABASE_URL unset, pgstage starts its own PostgreSQL.

CI runs with DATABASE_URL set, so this test boots the embedded server itself, in a
temporary data directory, and connects to the database it reports."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from config.embedded import DATABASE_NAME, embedded_database_url
from tests.conftest import ROOT


def stop(data_dir: Path) -> None:
    pid_file = data_dir / "postmaster.pid"
    if pid_file.exists():
        os.kill(int(pid_file.read_text().split()[0]), signal.SIGINT)
        deadline = time.monotonic() + 20
        while pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def manage_embedded(data: Path, *args: str) -> subprocess.CompletedProcess:
    """``manage.py`` with DATABASE_URL unset and its data directory under ``data``."""
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PGSTAGE_DATA_DIR"] = str(data)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.fixture
def checkout_tmp() -> Iterator[Path]:
    """A directory under the checkout's ``.data/``: the server's own user (pgserver's,
    when run as root) can reach it, where it cannot reach pytest's private temporary
    directories."""
    (ROOT / ".data").mkdir(exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="test-make-", dir=ROOT / ".data"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_command_that_needs_no_database_starts_no_server(tmp_path):
    done = manage_embedded(tmp_path, "help")
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "pg").exists()
    assert "embedded PostgreSQL" not in done.stderr


@pytest.mark.slow
def test_the_command_that_starts_the_server_says_it_is_left_running(checkout_tmp):
    tmp_path = checkout_tmp
    data_dir = tmp_path / "pg"
    try:
        first = manage_embedded(tmp_path, "showmigrations", "queueing")
        assert first.returncode == 0, first.stderr
        assert "0001_exclusive_singleton_index" in first.stdout
        assert (data_dir / "postmaster.pid").exists()
        assert "embedded PostgreSQL this command started is still running" in first.stderr
        assert "make stop-db" in first.stderr
        # The next command reuses it, and has nothing to say about it.
        second = manage_embedded(tmp_path, "showmigrations", "queueing")
        assert second.returncode == 0, second.stderr
        assert "embedded PostgreSQL" not in second.stderr
    finally:
        stop(data_dir)


@pytest.mark.slow
def test_embedded_server_starts_creates_the_database_and_is_reused(checkout_tmp):
    data_dir = checkout_tmp / "pg"
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
        stop(data_dir)


def running_pid(data_dir: Path) -> int | None:
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return pid


@pytest.mark.slow
def test_make_test_stops_the_embedded_server_it_started_and_only_that(checkout_tmp):
    """``make test-fast`` with DATABASE_URL unset, its pytest replaced by a stand-in that
    records the server it finds: a server the target started is stopped afterwards, one
    that was running already is left running."""
    tmp_path = checkout_tmp
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then\n'
        '  head -1 "$PGSTAGE_DATA_DIR/pg/postmaster.pid" >> "$PGSTAGE_DATA_DIR/suite-saw"\n'
        "  exit 0\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env["PGSTAGE_DATA_DIR"] = str(tmp_path)
    data_dir = tmp_path / "pg"

    def make_test() -> str:
        done = subprocess.run(
            ["make", "--no-print-directory", "test-fast", f"BIN={bin_dir}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout + done.stderr

    try:
        out = make_test()
        [seen] = (tmp_path / "suite-saw").read_text().split()
        assert "starting the embedded PostgreSQL" in out, out
        assert "embedded PostgreSQL stopped (the tests started it)" in out, out
        deadline = time.monotonic() + 20
        while running_pid(data_dir) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert running_pid(data_dir) is None, f"the server {seen} is still running"

        embedded_database_url(data_dir)
        before = running_pid(data_dir)
        out = make_test()
        assert "starting" not in out and "stopped" not in out
        assert running_pid(data_dir) == before
    finally:
        stop(data_dir)


def test_the_embedded_backend_fills_in_its_server_and_keeps_a_host_set_on_the_connection(
    monkeypatch,
):
    """An empty HOST (or the one it filled in before) is the embedded server's socket; a
    HOST set on the connection (a proxy in front of the server: the round-trip tests put
    one there) is kept, with its port. Parameters only: no server is started."""
    from config.embedded import base

    url = "postgresql://postgres@/pgstage?host=/srv/pg/run&port=5433"
    monkeypatch.setattr(base, "ensure_started", lambda data_dir: url)

    def params(host: str, port: str) -> dict:
        wrapper = base.DatabaseWrapper(
            {
                "NAME": "pgstage",
                "USER": "",
                "PASSWORD": "",
                "HOST": host,
                "PORT": port,
                "OPTIONS": {},
                "CONN_MAX_AGE": 0,
                "CONN_HEALTH_CHECKS": False,
                "AUTOCOMMIT": True,
                "ATOMIC_REQUESTS": False,
                "TIME_ZONE": None,
            },
            alias="embedded-params",
        )
        got = wrapper.get_connection_params()
        return {"host": got.get("host"), "port": got.get("port")}

    assert params("", "") == {"host": "/srv/pg/run", "port": "5433"}
    assert params("/srv/pg/run", "5433") == {"host": "/srv/pg/run", "port": "5433"}
    assert params("127.0.0.1", "40001") == {"host": "127.0.0.1", "port": "40001"}
