"""Real servers for tests: a private PostgreSQL the test may stop and start, and the
production web server (gunicorn) on a free port of 127.0.0.1.

Nothing here touches the shared PostgreSQL: a private server lives in the test's temp
directory, listens on its own port and is stopped at teardown.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from config.embedded import ensure_system_user

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def http(
    method: str,
    url: str,
    *,
    body: object = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> Reply:
    """One HTTP request; any status is a :class:`Reply` (connection errors raise)."""
    data = None
    headers = dict(headers or {})
    if body is not None:
        data = json.dumps(body).encode()
        headers.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Reply(response.status, dict(response.headers), response.read())
    except urllib.error.HTTPError as exc:
        return Reply(exc.code, dict(exc.headers), exc.read())


def wait_until(
    predicate, *, timeout: float, message: str | Callable[[], str], interval: float = 0.1
) -> None:
    """Poll ``predicate`` (a refused connection counts as not yet); ``message`` may be a
    callable, read only on a timeout (e.g. what the server said last)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(interval)
    text = message() if callable(message) else message
    raise AssertionError(f"timed out after {timeout}s waiting for {text}")


@dataclass
class PrivatePostgres:
    """A PostgreSQL cluster in a fresh temp directory (pgserver's bundled binaries, which
    also handle running as root), listening on 127.0.0.1:``port``. :meth:`remove` stops it
    and deletes the directory.

    Not under pytest's ``tmp_path``: as root the server runs as another user, which must
    reach its directory, and every pytest session resets pytest's base directory to 0700.
    """

    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        # pgserver asks platformdirs for a runtime directory at import (for its lock
        # file), which warns when XDG_RUNTIME_DIR is unset: give it one that lasts.
        if not os.environ.get("XDG_RUNTIME_DIR"):
            runtime = Path(tempfile.gettempdir()) / f"pgstage-runtime-{os.getuid()}"
            runtime.mkdir(mode=0o700, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        import pgserver

        self.root = Path(tempfile.mkdtemp(prefix="pgstage-pg-"))
        self.data = self.root / "pg"
        # initdb (as the 'pgserver' user when root) and a first start on a socket only;
        # restarted below on TCP so the test can stop and start it at will.
        ensure_system_user()
        server = pgserver.get_server(str(self.data), cleanup_mode=None)
        self.user = server.system_user
        self.stop()
        self.start()

    def _pg_ctl(self, *args: str, timeout: float = 60) -> None:
        from pgserver import _commands

        _commands.pg_ctl(list(args), pgdata=self.data, user=self.user, timeout=timeout)

    def start(self) -> None:
        self._pg_ctl(
            "-w",
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.data}",
            "-l",
            str(self.data / "server.log"),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``fast``: roll back open transactions, close connections)."""
        self._pg_ctl("-w", "-m", mode, "stop")

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def remove(self) -> None:
        if self.running:
            self.stop(mode="immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def manage(*args: str, env: dict[str, str], timeout: float = 180) -> str:
    """Run ``manage.py`` with ``env``; returns its stdout (raises with its output)."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise AssertionError(f"manage.py {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
    return done.stdout


@dataclass
class WebServer:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def start_web(env: dict[str, str], log_path: Path, **settings: str | int) -> WebServer:
    """Start gunicorn exactly as ``make run`` does (``queueing.gunicorn``), on a free port;
    ``settings`` are its environment knobs (``WEB_WORKERS=2``…)."""
    port = free_port()
    handle = open(log_path, "w")  # noqa: SIM115 - lives with the process
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "python:queueing.gunicorn", "config.wsgi"],
        cwd=ROOT,
        env={**env, "HOST": "127.0.0.1", "PORT": str(port)}
        | {k: str(v) for k, v in settings.items()},
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = WebServer(process=process, port=port, log_path=log_path)
    health = f"{server.url}/healthz"
    try:
        wait_until(
            lambda: process.poll() is not None or http("GET", health).status == 200,
            timeout=60,
            message="gunicorn to answer /healthz",
        )
    except AssertionError:
        server.stop()
        raise AssertionError(f"gunicorn did not start:\n{server.log()}") from None
    if process.poll() is not None:
        raise AssertionError(f"gunicorn exited with {process.returncode}:\n{server.log()}")
    return server


PGBOUNCER_PATHS = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """PgBouncer from Debian's package, installed here when missing (as root, as on CI;
    like ``make e2e`` installs Chromium). None when it cannot be had."""
    found = shutil.which("pgbouncer") or next(
        (p for p in PGBOUNCER_PATHS if os.path.exists(p)), None
    )
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, timeout=600)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "pgbouncer"],
        env=env,
        check=True,
        timeout=600,
        capture_output=True,
    )
    return shutil.which("pgbouncer") or next(
        (p for p in PGBOUNCER_PATHS if os.path.exists(p)), None
    )


@dataclass
class PgBouncer:
    """PgBouncer in transaction mode on 127.0.0.1:``port`` in front of one database;
    ``pool_size`` server connections at most, whatever the number of clients.
    ``server_host`` may be a Unix socket's directory (the embedded server listens on no
    TCP port): run as root, PgBouncer then drops to the directory's owner, the one user
    that may reach a socket in a private directory."""

    binary: str
    server_host: str
    server_port: int
    dbname: str
    user: str = "postgres"
    pool_size: int = 3
    port: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pgstage-pgbouncer-"))
        (self.root / "userlist.txt").write_text(f'"{self.user}" ""\n')
        (self.root / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"{self.dbname} = host={self.server_host} port={self.server_port} "
            f"dbname={self.dbname}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {self.root / 'userlist.txt'}\n"
            f"admin_users = {self.user}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.root / 'pgbouncer.log'}\n"
            f"pidfile = {self.root / 'pgbouncer.pid'}\n"
        )
        args = [self.binary, str(self.root / "pgbouncer.ini")]
        if os.geteuid() == 0:
            # PgBouncer refuses to run as root: it drops to an ordinary user.
            import pwd

            if self.server_host.startswith("/"):
                owner = pwd.getpwuid(os.stat(self.server_host).st_uid).pw_name
            else:
                owner = next(
                    (u for u in ("postgres", "pgserver", "nobody") if _has_user(u)), "nobody"
                )
            entry = pwd.getpwnam(owner)
            self.root.chmod(0o755)
            for path in self.root.iterdir():
                path.chmod(0o644)
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            args[1:1] = ["-u", owner]
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(
            lambda: self.process.poll() is not None or self._answers(),
            timeout=30,
            message="PgBouncer to accept connections",
        )
        if self.process.poll() is not None:
            raise AssertionError(f"PgBouncer exited: {self.log()}")

    def _answers(self) -> bool:
        try:
            with psycopg.connect(self.url(), connect_timeout=2, prepare_threshold=None) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.OperationalError:
            return False

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    def show(self, what: str) -> list[dict]:
        """``SHOW <what>`` on PgBouncer's admin console, as dicts."""
        admin = f"postgresql://{self.user}@127.0.0.1:{self.port}/pgbouncer"
        with psycopg.connect(admin, autocommit=True, prepare_threshold=None) as conn:
            cursor = conn.execute(f"SHOW {what}")
            names = [c.name for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)


def _has_user(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
