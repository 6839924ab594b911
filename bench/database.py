"""The harness's database chores: its named SQL, the URL its workers use, what the server
offers (pg_stat_statements), and removing every row it created."""

from __future__ import annotations

import collections
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import psycopg
from django.db import connection, transaction

from queueing.sql import load

logger = logging.getLogger(__name__)

queries = load("bench", "bench.sql")
#: The harness's tenants; a crashed run's leftovers are removed by the next one.
TENANT_PREFIX = "bench-"
#: The harness's queues (jobs on them are removed before and after each run).
QUEUE_PATTERN = "bench%"
#: Statements of the harness itself carry this marker, so pg_stat_statements' counts
#: leave them out (each is the harness's own: no worker runs the same statement).
MARKER = "/* bench */"


def fetch_one(name: str, **params: Any) -> tuple[Any, ...] | None:
    with connection.cursor() as cursor:
        cursor.execute(f"{MARKER} {queries[name]}", params)
        return cursor.fetchone()


def fetch_all(name: str, **params: Any) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(f"{MARKER} {queries[name]}", params)
        return cursor.fetchall()


def fetch_value(name: str, **params: Any) -> Any:
    row = fetch_one(name, **params)
    return None if row is None else row[0]


def execute(name: str, **params: Any) -> int:
    """Run every statement of block ``name`` in order; returns the last row count."""
    count = 0
    with connection.cursor() as cursor:
        for statement in queries[name].split(";\n"):
            if statement.strip():
                cursor.execute(f"{MARKER} {statement}", params)
                count = cursor.rowcount
    return count


def server_params() -> dict[str, Any]:
    """Host (a name or a socket directory), port, user, password and database of the live
    connection, as psycopg takes them."""
    connection.ensure_connection()
    info = connection.connection.info
    password = connection.settings_dict.get("PASSWORD") or None
    return {
        "host": info.host,
        "port": info.port,
        "user": info.user,
        "password": password,
        "dbname": info.dbname,
    }


#: The options a worker's URL carries: libpq's connection parameters, but for those the
#: URL names in its own parts, and the process's name, which the harness sets per process
#: (PGAPPNAME), and which a URL's would override.
CARRIED_OPTIONS = frozenset(
    option.keyword.decode() for option in psycopg.pq.Conninfo.get_defaults()
) - {"host", "port", "user", "password", "dbname", "application_name"}


def database_url(settings_dict: Mapping[str, Any] | None = None) -> str:
    """A ``DATABASE_URL`` for the harness's worker subprocesses: the database of
    ``settings_dict`` (this process's connection's by default) as the settings parse it
    back — every server of a multi-host list with its own port (libpq tries them in
    turn), a socket directory, and the libpq options such as ``target_session_attrs``
    and ``sslmode``; not only the server this process happened to reach."""
    if settings_dict is None:
        connection.ensure_connection()  # the embedded server's backend fills in HOST
        settings_dict = connection.settings_dict
    options = dict(settings_dict.get("OPTIONS") or {})
    hosts = str(settings_dict.get("HOST") or options.get("host") or "")
    ports = str(settings_dict.get("PORT") or options.get("port") or "")
    auth = quote(str(settings_dict.get("USER") or ""), safe="")
    if settings_dict.get("PASSWORD"):
        auth += ":" + quote(str(settings_dict["PASSWORD"]), safe="")
    query = {key: value for key, value in options.items() if key in CARRIED_OPTIONS}
    if hosts.startswith("/"):  # the socket directory goes in the query, as libpq reads it
        servers = ""
        query = {"host": hosts, **({"port": ports} if ports else {}), **query}
    else:
        host_list = hosts.split(",")
        port_list = ports.split(",") if "," in ports else [ports] * len(host_list)
        servers = ",".join(
            (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
            for host, port in zip(host_list, port_list, strict=True)
        )
    name = quote(str(settings_dict.get("NAME") or ""), safe="")
    return f"postgresql://{auth}@{servers}/{name}" + (f"?{urlencode(query)}" if query else "")


def last_job_id() -> int:
    return int(fetch_value("last_job_id"))


def discard_batch(after: int) -> None:
    """Delete what a measured batch created (its jobs newer than ``after`` that are not
    running, their next hops, its steps) and vacuum what it left behind."""
    execute("delete_batch", after=after)
    execute("vacuum_jobs")


def delete_bench_jobs() -> None:
    execute("delete_bench_jobs", pattern=QUEUE_PATTERN)


@dataclass(frozen=True, kw_only=True)
class Server:
    version: str
    max_connections: int
    shared_preload_libraries: str
    statements: bool
    statements_note: str
    #: Settings that move a queue's figures: autovacuum (dead rows of finished jobs stay
    #: in the indexes a fetch walks until it runs), and what a COMMIT waits for.
    settings: dict[str, str]


#: The server settings each run records beside its figures.
RECORDED_SETTINGS = ("autovacuum", "synchronous_commit", "fsync")


def server() -> Server:
    """What the server is and whether pg_stat_statements can count statements here
    (it must be preloaded; the extension is created in this database when missing)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('server_version')")
        version = cursor.fetchone()[0]
        cursor.execute("SELECT current_setting('max_connections')::int")
        max_connections = cursor.fetchone()[0]
        cursor.execute("SELECT current_setting('shared_preload_libraries')")
        preload = cursor.fetchone()[0]
        cursor.execute(
            "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)", [list(RECORDED_SETTINGS)]
        )
        recorded = dict(cursor.fetchall())
    statements, note = (
        False,
        (
            "pg_stat_statements is not available: the server's shared_preload_libraries is "
            f"{preload or 'empty'}; statements are counted on the wire instead "
            "(bench.wire, a counting proxy)"
        ),
    )
    if "pg_stat_statements" in preload:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            statements, note = True, "pg_stat_statements is available and counts them too"
        except Exception as exc:  # a role without the privilege: the wire only
            note = f"pg_stat_statements is preloaded but not usable here ({exc})"
    return Server(
        version=version,
        max_connections=max_connections,
        shared_preload_libraries=preload,
        statements=statements,
        statements_note=note,
        settings=recorded,
    )


#: A foreign-key check a trigger ran: pg_stat_statements reports it as a top-level
#: statement, though no client sent it.
FOREIGN_KEY_CHECK = re.compile(r"^SELECT \$\d+ FROM ONLY \S+ x WHERE .* FOR KEY SHARE OF x$", re.S)


def statement_calls() -> collections.Counter[str]:
    """pg_stat_statements' calls per query in this database: statements clients sent
    (``toplevel``; not those a trigger ran), the harness's own left out."""
    with connection.cursor() as cursor:
        cursor.execute(
            MARKER + " SELECT query, calls FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND toplevel"
        )
        rows = cursor.fetchall()
    calls: collections.Counter[str] = collections.Counter()
    for query, n in rows:
        if MARKER not in query:
            calls[query] += n
    return calls


def purge_tenant(tenant_id: int) -> None:
    """Delete a bench tenant and every row of it (its jobs first). A failure is logged,
    never raised: a schema that grew a table the harness does not know about leaves a
    tenant behind, not a broken run."""
    for block in ("purge_procrastinate_jobs", "purge_runs", "purge_pipeline", "purge_accounts"):
        try:
            with transaction.atomic():
                execute(block, tenant=tenant_id)
        except Exception as exc:
            logger.warning("could not remove bench tenant %s (%s): %s", tenant_id, block, exc)
            return


def purge_leftovers() -> None:
    """Remove what an interrupted earlier run left: bench tenants and bench queues."""
    from accounts.models import Tenant

    for tenant_id in Tenant.objects.filter(slug__startswith=TENANT_PREFIX).values_list(
        "pk", flat=True
    ):
        purge_tenant(tenant_id)
    delete_bench_jobs()
