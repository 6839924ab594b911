"""What a statement's plan reads, measured: the tests that hold a query to its indexes
whatever the table's statistics say count the rows its scans touched."""

from __future__ import annotations

import re
from typing import Any

from django.db import connection


def rows_read(
    query: str,
    params: dict,
    *,
    settings: str | None = None,
    generic: bool = False,
    relation: str | None = None,
) -> Read:
    """The rows every scan node of ``query``'s plan read, summed (EXPLAIN ANALYZE, in a
    transaction rolled back), after ``settings`` (a statement, such as
    ``queueing.planner.WALK_SETTINGS``, that the query runs under); ``generic``: of its
    generic plan, the one a prepared statement may settle on, whatever the parameters;
    ``relation``: only the scans of that table (a bitmap's index scan has none: its heap
    scan counts)."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            if settings:
                cursor.execute(settings)
            if generic:
                names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", query)))
                prepared = re.sub(
                    r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", query
                )
                # Sent without parameters: a literal % is no longer doubled.
                prepared = prepared.replace("%%", "%")
                cursor.execute(f"PREPARE pgstage_generic AS {prepared}")
                cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                arguments = ", ".join(f"%({name})s" for name in names)
                query = f"EXECUTE pgstage_generic ({arguments})"
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params)
            (plan,) = cursor.fetchone()
        finally:
            cursor.execute("ROLLBACK")
            if generic:
                cursor.execute("DEALLOCATE ALL")
    return Read(_read(plan[0]["Plan"], relation), plan[0]["Plan"])


class Read(int):
    """The rows read, an ``int`` that shows the plan's scans when it is reported (an
    assertion's message names what was read, and where)."""

    plan: dict[str, Any]

    def __new__(cls, rows: int, plan: dict[str, Any]) -> Read:
        read = super().__new__(cls, rows)
        read.plan = plan
        return read

    def __repr__(self) -> str:
        return f"{int(self)} rows read:\n" + "\n".join(_scans(self.plan, 0))


def _scans(node: dict[str, Any], depth: int) -> list[str]:
    line = "  " * depth + node["Node Type"]
    for key in ("Relation Name", "Index Name", "Index Cond", "Filter"):
        if key in node:
            line += f" {key.split()[0].lower()}={node[key]}"
    if "Actual Rows" in node:
        line += f" rows={node['Actual Rows']} loops={node['Actual Loops']}"
        line += f" removed={node.get('Rows Removed by Filter', 0)}"
    lines = [line]
    for child in node.get("Plans", []):
        lines.extend(_scans(child, depth + 1))
    return lines


def _read(node: dict[str, Any], relation: str | None) -> int:
    own = 0
    scan = "Scan" in node["Node Type"] and node["Node Type"] not in ("CTE Scan", "WorkTable Scan")
    if scan and relation in (None, node.get("Relation Name")):
        # EXPLAIN gives both per loop (averaged over the node's loops).
        removed = node.get("Rows Removed by Filter", 0) + node.get(
            "Rows Removed by Index Recheck", 0
        )
        own = (node["Actual Rows"] + removed) * node["Actual Loops"]
    return own + sum(_read(child, relation) for child in node.get("Plans", []))


#: The parameters of ``pgstage_fetch_job_v1``, in order, by the names the worker's fetch
#: statement (``fetch_job`` in ``queueing/sql/worker.sql``) passes them under.
FETCH_PARAMETERS = ("queues", "worker_id", "task_names", "timeout_tasks", "timeout_seconds")


def fetch_statement() -> str:
    """The statement ``pgstage_fetch_job_v1`` runs, read from the installed function (its
    ``RETURN QUERY``), with its parameters as the named placeholders of
    :data:`FETCH_PARAMETERS`: what the tests hold to procrastinate's conditions and
    measure under the function's settings (``queueing.planner.FETCH_SETTINGS``)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'pgstage_fetch_job_v1'")
        (source,) = cursor.fetchone()
    start = source.index("RETURN QUERY") + len("RETURN QUERY")
    end = source.rindex(";", 0, source.rindex("END;"))
    statement = source[start:end].strip()
    for number, name in enumerate(FETCH_PARAMETERS, 1):
        statement = re.sub(rf"\${number}(?!\d)", f"%({name})s", statement)
    assert "$" not in statement, statement
    return statement


#: The rows this session's transaction has read from ``procrastinate_jobs`` so far: the
#: tuples its sequential scans read and its index scans returned, by the server's
#: per-transaction counters (``pg_stat_get_xact_*``), which see inside a function, where
#: EXPLAIN sees only the call.
SESSION_ROWS_READ = (
    "SELECT coalesce(pg_stat_get_xact_tuples_returned('procrastinate_jobs'::regclass), 0)"
    " + coalesce((SELECT sum(pg_stat_get_xact_tuples_returned(i.indexrelid))"
    "               FROM pg_index i"
    "              WHERE i.indrelid = 'procrastinate_jobs'::regclass), 0)"
)
