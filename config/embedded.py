"""Embedded PostgreSQL for machines without a configured server.

When ``DATABASE_URL`` is unset, pgstage starts (or reuses) a PostgreSQL data directory
under ``.data/`` with the ``pgserver`` package, so ``make demo`` and ``make test`` work on
a fresh machine. The server outlives the process that started it, so a worker and a web
process share it; ``make stop-db`` stops it.
"""

from __future__ import annotations

import os
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

DATABASE_NAME = "pgstage"


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
