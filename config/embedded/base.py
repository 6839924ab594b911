"""The Django database backend of the embedded server: PostgreSQL's, which starts the
server when it first connects (config.embedded)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings
from django.db.backends.postgresql import base
from psycopg.conninfo import conninfo_to_dict

from config.embedded import ensure_started


class DatabaseWrapper(base.DatabaseWrapper):
    def get_connection_params(self) -> dict[str, Any]:
        info = conninfo_to_dict(ensure_started(Path(settings.DATA_DIR) / "pg"))
        host = info.get("host") or ""
        # A HOST someone set on this connection (a proxy in front of the server, as the
        # round-trip tests put one) is kept: only an empty HOST, or the one filled in here
        # before, is the embedded server's.
        if self.settings_dict.get("HOST") in ("", None, host):
            self.settings_dict["HOST"] = host
            self.settings_dict["PORT"] = info.get("port") or ""
        self.settings_dict["USER"] = info.get("user") or "postgres"
        return super().get_connection_params()
