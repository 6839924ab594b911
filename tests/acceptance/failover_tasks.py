"""Loaded into the failover test's workers (``PGSTAGE_TASK_MODULES``): a generic task whose
runs and effects are logged to a file outside the database, so that what the database
forgets in a failover still shows.

The effect is fenced in the database: one row per label (``INSERT … ON CONFLICT DO
NOTHING``), and the log line ``effect`` is written only after that row's commit was
acknowledged. A label with two ``effect`` lines is an effect done twice: the second run
found no row, so an acknowledged commit was lost, or the fence failed.
"""

from __future__ import annotations

import json
import os
import time

from django.db import connection, transaction

from queueing.app import task

#: The environment variable naming the log file (JSON lines, appended by every worker).
LOG_VARIABLE = "FAILOVER_EFFECTS_LOG"
TABLE_DDL = "CREATE TABLE failover_effects (label text PRIMARY KEY, port int NOT NULL)"


def log(event: str, label: str, port: int) -> None:
    """One line, one ``write`` on an ``O_APPEND`` file: lines of concurrent writers never
    interleave."""
    line = json.dumps({"at": time.time(), "event": event, "label": label, "port": port})
    fd = os.open(os.environ[LOG_VARIABLE], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


@task(name="tests.failover.effect")
def effect(label: str, seconds: float = 0.1) -> None:
    """``start`` (with the port of the server the run reached), a short computation, then
    the fenced effect: ``effect`` when this run made it, ``again`` when a run before it
    had (its outcome was lost with its connection)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT inet_server_port()")
        (port,) = cursor.fetchone()
    log("start", label, port)
    time.sleep(seconds)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO failover_effects (label, port) VALUES (%s, inet_server_port()) "
            "ON CONFLICT (label) DO NOTHING RETURNING port",
            [label],
        )
        made = cursor.fetchone()
    log("effect" if made else "again", label, port)
