"""A private PostgreSQL server for the tests that stop, restart or cut off the database.

Started by the test (``pgserver``'s binaries, a data directory under the test's temporary
directory, a Unix socket only), so stopping it disturbs nothing else the suite uses. With a
``port`` it also listens on 127.0.0.1:``port`` (TCP), so a proxy can sit in front of it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from config.embedded import ensure_system_user
from tests.conftest import ROOT

DATABASE = "pgstage"


class PrivateServer:
    def __init__(self, data_dir: Path, *, port: int | None = None):
        if not os.environ.get("XDG_RUNTIME_DIR"):
            runtime = data_dir.parent / "run"
            runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import pgserver

        ensure_system_user()
        self._server = pgserver.get_server(str(data_dir), cleanup_mode="delete")
        self.data_dir = Path(self._server.pgdata)
        self._server.psql(f"CREATE DATABASE {DATABASE};")
        self.url = self._server.get_uri(DATABASE)
        self.port = port
        if port is not None:
            # pgserver starts it on a socket only (``-h ""``); start it again on TCP too.
            self._socket_dir = self._server.get_postmaster_info().socket_dir
            self.stop()
            self.start()
            self.url = f"postgresql://postgres@127.0.0.1:{port}/{DATABASE}"

    def connect(self, **kwargs) -> psycopg.Connection:
        return psycopg.connect(self.url, autocommit=True, **kwargs)

    def pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl

        pg_ctl(list(args), pgdata=self.data_dir, user=self._server.system_user, timeout=60)

    def stop(self) -> None:
        """A fast shutdown: sessions are terminated, the server goes away."""
        self.pg_ctl("-w", "-m", "fast", "stop")

    def crash(self) -> None:
        """An immediate shutdown, as a crash is: sessions are cut without a checkpoint, and
        the next start recovers from the write-ahead log. A commit made with
        ``synchronous_commit`` off whose log had not reached the disk is lost (a
        claims-first task's fetch, ``queueing.flush``)."""
        self.pg_ctl("-w", "-m", "immediate", "stop")

    def start(self) -> None:
        if self.port is None:
            self._server.ensure_postgres_running()
            return
        options = f"-h 127.0.0.1 -p {self.port} -k {self._socket_dir}"
        self.pg_ctl("-w", "-o", options, "-l", str(self.data_dir / "log"), "start")

    def restart(self) -> None:
        self.stop()
        self.start()

    def terminate(self, application_name: str) -> int:
        """``pg_terminate_backend`` every session of ``application_name``; returns how many."""
        with self.connect() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s AND pid <> pg_backend_pid()",
                [application_name],
            ).fetchall()
        return len(rows)

    def migrate(self) -> None:
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=ROOT,
            env={**os.environ, "DATABASE_URL": self.url},
            check=True,
            timeout=300,
        )

    def close(self) -> None:
        """Stop the server for good (an immediate shutdown: its data goes with it), then
        let pgserver remove its directory. pgserver stops only a postmaster it knows to be
        running; a server that the test stopped and started again on TCP, or that a fault
        was starting, is stopped here by its data directory."""
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self.pg_ctl("-w", "-m", "immediate", "stop")
        self._server.cleanup()


@contextmanager
def private_server(*, port: int | None = None) -> Iterator[PrivateServer]:
    """A server in a fresh directory readable by the server's own system user (pytest's
    temporary directories are private to root); on TCP ``port`` too when given."""
    base = Path(tempfile.mkdtemp(prefix="pgstage-pg-"))
    base.chmod(0o755)
    server = PrivateServer(base / "data", port=port)
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(base, ignore_errors=True)
