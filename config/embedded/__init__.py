"""Embedded PostgreSQL for machines without a configured server.

When ``DATABASE_URL`` is unset, the site's database is this package used as a Django
database backend (``ENGINE = "config.embedded"``): the first connection a process opens
starts (or reuses) a PostgreSQL data directory under ``.data/`` with the ``pgserver``
package, so ``make demo`` and ``make test`` work on a fresh machine, while a command that
needs no database (``manage.py help``) starts nothing. The server outlives the process
that started it, so a worker and a web process share it; that process says so when it
exits, with how to stop it (``make stop-db``).
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

DATABASE_NAME = "pgstage"


def ensure_system_user() -> None:
    """As root, pgserver runs PostgreSQL as a system user ``pgserver`` that it creates
    (``useradd``) on first use. Servers started at once on a fresh machine (a test run's
    parallel workers) race there: one looks up a user id another's ``useradd`` replaced,
    and initdb fails ("could not look up effective user ID"). Created here, one process
    at a time (a file lock), before any ``pgserver.get_server``."""
    if os.name != "posix" or os.geteuid() != 0:
        return
    import fcntl
    import tempfile

    from pgserver.utils import ensure_user_exists

    with open(Path(tempfile.gettempdir()) / "pgstage-pgserver-user.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ensure_user_exists("pgserver")


def embedded_database_url(data_dir: Path) -> str:
    """Start or reuse the embedded server and return a URL for pgstage's database.

    Idempotent: a second call (from a worker or another process) finds the running server.
    """
    try:
        # pgserver asks platformdirs for a runtime directory at import, which warns when
        # XDG_RUNTIME_DIR is unset or shared (containers, CI): give it a private one.
        if not os.environ.get("XDG_RUNTIME_DIR"):
            runtime = data_dir.parent / "run"
            runtime.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.environ["XDG_RUNTIME_DIR"] = str(runtime)
        data_dir.mkdir(parents=True, exist_ok=True)
        import pgserver

        ensure_system_user()
        server = pgserver.get_server(str(data_dir), cleanup_mode=None)
        exists = server.psql(f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE_NAME}';")
        if "(1 row)" not in exists:
            server.psql(f"CREATE DATABASE {DATABASE_NAME};")
    except ImportError as exc:  # pragma: no cover - installed by pyproject
        raise ImproperlyConfigured(
            "DATABASE_URL is unset and the 'pgserver' package is missing: run 'make install' "
            "or set DATABASE_URL=postgresql://user@host:5432/dbname."
        ) from exc
    except Exception as exc:
        raise ImproperlyConfigured(
            f"Could not start the embedded PostgreSQL under {data_dir}: {exc}. "
            f"Remove {data_dir} to start afresh, or set DATABASE_URL to a running server "
            "(e.g. postgresql://postgres@127.0.0.1:5432/pgstage)."
        ) from exc
    return server.get_uri(DATABASE_NAME)


def pid_file(data_dir: Path) -> Path:
    return data_dir / "postmaster.pid"


def running(data_dir: Path) -> bool:
    """Whether a server runs on ``data_dir`` (its postmaster.pid names a live process)."""
    try:
        pid = int(pid_file(data_dir).read_text().split()[0])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def left_running_notice(data_dir: Path) -> str:
    return (
        f"The embedded PostgreSQL this command started is still running under {data_dir} "
        "(later commands, workers and the web server reuse it). Stop it with "
        "'make stop-db' (or: kill -INT $(head -1 "
        f"{pid_file(data_dir)})).\n"
    )


def _say_left_running(data_dir: Path) -> None:
    if running(data_dir):
        sys.stderr.write(left_running_notice(data_dir))


_started: dict[Path, str] = {}


def ensure_started(data_dir: Path) -> str:
    """The server's URL, starting it on this process's first call when it is not running;
    a process that started it says so when it exits. Sets ``DATABASE_URL`` so the
    processes this one starts (workers) reuse the server."""
    if data_dir not in _started:
        was_running = running(data_dir)
        url = embedded_database_url(data_dir)
        if not was_running:
            atexit.register(_say_left_running, data_dir)
        os.environ["DATABASE_URL"] = url
        _started[data_dir] = url
    return _started[data_dir]
