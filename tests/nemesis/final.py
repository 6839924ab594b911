"""The runner's reads of the database: what is still unfinished (polled until the system is
quiet), and the final read the checker judges, recorded in the history as one ``final``
line so that the checker runs on the history file alone.
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from tests.invariants import liveness_violations, violations

#: Each query returns the unfinished rows of one kind; the system is quiet when all are empty.
UNFINISHED = {
    "jobs waiting or running": """
        SELECT id, task_name, status::text FROM procrastinate_jobs
         WHERE status IN ('todo', 'doing') AND task_name NOT LIKE 'queueing.sweep%%'""",
    "inquiries with a stage neither succeeded nor given up": """
        SELECT a.id FROM anfragen a
         WHERE (SELECT count(*) FROM pipeline_runs r
                 WHERE r.anfrage_id = a.id AND r.status = 'success') < 4
           AND NOT EXISTS (SELECT 1 FROM pipeline_runs r
                            WHERE r.anfrage_id = a.id AND r.gave_up_at IS NOT NULL)""",
    "analyses queued, pending or running": """
        SELECT id, status FROM analysis_jobs
         WHERE status IN ('queued', 'pending', 'running') AND deleted_at IS NULL""",
    "terminal analyses with results and no run": """
        SELECT j.id FROM analysis_jobs j
         WHERE j.status IN ('complete', 'failed') AND j.deleted_at IS NULL
           AND j.doc_html IS NOT NULL AND j.results IS NOT NULL AND j.results <> '{}'::jsonb
           AND NOT EXISTS (SELECT 1 FROM analysis_runs r
                            WHERE r.id = j.run_id AND (r.job_id >= j.id OR r.job_id IS NULL))""",
    "runs not judged in their current version": """
        SELECT r.id FROM analysis_runs r
         WHERE NOT EXISTS (SELECT 1 FROM run_judgements g
                            WHERE g.run_id = r.id AND g.version = r.version)""",
    "owed give-up hooks": "SELECT job_id, task_name FROM pgstage_owed_give_ups",
}

#: Fenced domain effects beyond the invariants: a completed analysis is never refunded.
EXTRA_SAFETY = {
    "a complete analysis was refunded": """
        SELECT j.id FROM analysis_jobs j
          JOIN credit_ledger c ON c.job_id = j.id AND c.kind = 'refund'
         WHERE j.status = 'complete'""",
    "an inquiry holds other than its positions (doubled or lost by a stage)": """
        SELECT a.id, count(p.*) FROM anfragen a
          JOIN pipeline_runs r ON r.anfrage_id = a.id AND r.stage = 'extract'
                              AND r.status = 'success'
          LEFT JOIN anfrage_positions p ON p.anfrage_id = a.id
         GROUP BY a.id HAVING count(p.*) <> %(positions)s""",
}

GENERIC_JOBS = """
    SELECT id, task_name, status::text, args ->> 'key', attempts
      FROM procrastinate_jobs WHERE task_name LIKE 'nemesis.%%' ORDER BY id"""

#: Seconds from the database's return (a wall time) to the first job start after it, and
#: how many jobs were deferred before it and started after it (those waited for it).
FIRST_START_AFTER = """
    SELECT extract(epoch FROM min(e.at) - to_timestamp(%(wall)s)),
           count(DISTINCT e.job_id) FILTER (WHERE EXISTS (
               SELECT 1 FROM procrastinate_events d
                WHERE d.job_id = e.job_id AND d.type = 'deferred'
                  AND d.at < to_timestamp(%(wall)s)))
      FROM procrastinate_events e
     WHERE e.type = 'started' AND e.at > to_timestamp(%(wall)s)"""


def _rows(sql: str, params: dict[str, Any] | None = None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or {})
        return [tuple(row) for row in cursor.fetchall()]


def unfinished() -> dict[str, list[tuple]]:
    found = {}
    for name, sql in UNFINISHED.items():
        rows = _rows(sql)
        if rows:
            found[name] = rows[:20]
    return found


def final_read(*, database_returns: list[float], positions: int, clocks: dict) -> dict:
    """Everything the checker needs from the database, once the run is over."""
    extra = {}
    for name, sql in EXTRA_SAFETY.items():
        rows = _rows(sql, {"positions": positions})
        if rows:
            extra[name] = rows[:20]
    restarts = []
    for wall in database_returns:
        seconds, waiting = _rows(FIRST_START_AFTER, {"wall": wall})[0]
        restarts.append(
            {"wall": wall, "seconds": None if seconds is None else float(seconds), "jobs": waiting}
        )
    counts = dict(
        _rows(
            "SELECT task_name || ':' || status::text, count(*) FROM procrastinate_jobs GROUP BY 1"
        )
    )
    return {
        "invariants": violations(settled=True),
        "liveness": liveness_violations(
            stall_seconds=clocks["stall"], recovery_seconds=clocks["recovery"]
        ),
        "extra_safety": extra,
        "unfinished": unfinished(),
        "generic_jobs": _rows(GENERIC_JOBS),
        "restarts": restarts,
        "job_counts": counts,
        "domain_counts": {
            "inquiries": _rows("SELECT count(*) FROM anfragen")[0][0],
            "stage_successes": _rows("SELECT count(*) FROM pipeline_runs WHERE status = 'success'")[
                0
            ][0],
            "analyses": dict(_rows("SELECT status, count(*) FROM analysis_jobs GROUP BY 1")),
            "charges": _rows("SELECT count(*) FROM credit_ledger WHERE kind = 'charge'")[0][0],
            "refunds": _rows("SELECT count(*) FROM credit_ledger WHERE kind = 'refund'")[0][0],
            "runs": _rows("SELECT count(*) FROM analysis_runs")[0][0],
            "judgements": _rows("SELECT count(*) FROM run_judgements")[0][0],
        },
    }
