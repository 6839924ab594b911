"""DESIGN §5: the invariants the reliability scenarios assert after every run.

Each check is one SQL query returning the offending rows, so a failure names them.
``settled=True`` adds the checks that hold once work has quiesced (every job finished,
grace passed and the sweeps ran).
``LIVENESS`` checks take their time windows as named parameters (e.g.
``pipeline_resume_due_seconds``: the sweep's grace plus one period).
"""

from __future__ import annotations

from django.db import connection

ALWAYS = {
    "1. at most one pipeline_runs row per (tenant, anfrage, stage)": """
        SELECT tenant_id, anfrage_id, stage, count(*) FROM pipeline_runs
         GROUP BY 1, 2, 3 HAVING count(*) > 1""",
    "2a. at most one waiting job per singleton key (short)": """
        SELECT queueing_lock, count(*) FROM procrastinate_jobs
         WHERE status = 'todo' AND queueing_lock IS NOT NULL
         GROUP BY 1 HAVING count(*) > 1""",
    "2b. at most one waiting-or-running job per exclusive key": """
        SELECT queueing_lock, count(*) FROM procrastinate_jobs
         WHERE status IN ('todo', 'doing') AND queueing_lock LIKE 'exclusive/%%'
         GROUP BY 1 HAVING count(*) > 1""",
    "3a. every file audit entry names a file row that exists": """
        SELECT a.id, a.entity_id FROM audit_log a
          LEFT JOIN anfrage_files f ON f.id = a.entity_id
         WHERE a.entity_type = 'anfrage_file' AND f.id IS NULL""",
    "3b. every stored file has at least one audit entry": """
        SELECT f.id FROM anfrage_files f
         WHERE NOT EXISTS (SELECT 1 FROM audit_log a
                            WHERE a.entity_type = 'anfrage_file' AND a.entity_id = f.id)""",
    "4. per user at most one first-pass analysis job pending or running": """
        SELECT user_id, count(*) FROM analysis_jobs
         WHERE status IN ('pending', 'running') AND delta_of_job_id IS NULL
           AND deleted_at IS NULL
         GROUP BY 1 HAVING count(*) > 1""",
    "5a. every admitted job is charged exactly once": """
        SELECT j.id, count(c.id) FROM analysis_jobs j
          LEFT JOIN credit_ledger c ON c.job_id = j.id AND c.kind = 'charge'
         GROUP BY 1 HAVING count(c.id) <> 1""",
    "5b. at most one refund per job": """
        SELECT job_id, count(*) FROM credit_ledger WHERE kind = 'refund'
         GROUP BY 1 HAVING count(*) > 1""",
    "5c. no balance is negative": """
        SELECT user_id, sum(amount) FROM credit_ledger GROUP BY 1 HAVING sum(amount) < 0""",
    "6a. at most one run per run id (one row per job's run)": """
        SELECT job_id, count(*) FROM analysis_runs GROUP BY 1 HAVING count(*) > 1""",
    "7a. every run version is judged at most once": """
        SELECT run_id, version, count(*) FROM run_judgements
         GROUP BY 1, 2 HAVING count(*) > 1""",
}

SETTLED = {
    "6b. every terminal job with doc_html and results has its run": """
        SELECT j.id FROM analysis_jobs j
         WHERE j.status IN ('complete', 'failed') AND j.deleted_at IS NULL
           AND j.doc_html IS NOT NULL AND j.results IS NOT NULL
           AND j.results <> '{}'::jsonb
           AND NOT EXISTS (SELECT 1 FROM analysis_runs r WHERE r.id = j.run_id)""",
    "7b. every recorded run is judged (its current version)": """
        SELECT r.id FROM analysis_runs r
         WHERE NOT EXISTS (SELECT 1 FROM run_judgements g
                            WHERE g.run_id = r.id AND g.version = r.version)""",
    "8. no job is left waiting or running": """
        SELECT id, task_name, status FROM procrastinate_jobs
         WHERE status IN ('todo', 'doing') AND task_name NOT LIKE 'queueing.sweep%%'""",
}


LIVENESS = {
    "11a. every stage that can run has a live job or is due for the pipeline_resume sweep": """
        SELECT a.id, s.stage FROM anfragen a
         CROSS JOIN LATERAL (
               SELECT o.stage, o.ord, r.status, r.gave_up_at, r.lease_expires_at, r.finished_at
                 FROM unnest(ARRAY['intake', 'extract', 'feasibility', 'calculate'])
                      WITH ORDINALITY AS o(stage, ord)
                 LEFT JOIN pipeline_runs r
                        ON r.tenant_id = a.tenant_id AND r.anfrage_id = a.id
                       AND r.stage = o.stage
                WHERE r.status IS DISTINCT FROM 'success'
                ORDER BY o.ord LIMIT 1) s
          LEFT JOIN pipeline_runs p
                 ON p.tenant_id = a.tenant_id AND p.anfrage_id = a.id
                AND p.stage = (ARRAY['intake', 'extract', 'feasibility', 'calculate'])[s.ord - 1]
         WHERE s.gave_up_at IS NULL
           AND (s.status IS NULL OR s.status = 'failed'
                OR (s.status = 'running' AND s.lease_expires_at < now()))
           AND coalesce(s.lease_expires_at, s.finished_at, p.finished_at, a.created_at)
               < now() - %(pipeline_resume_due_seconds)s * interval '1 second'
           AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs j
                            WHERE j.task_name = 'pipeline.' || s.stage
                              AND j.args ->> 'anfrage_id' = a.id::text
                              AND j.status IN ('todo', 'doing'))""",
}


def violations(*, settled: bool = False) -> dict[str, list[tuple]]:
    checks = {**ALWAYS, **(SETTLED if settled else {})}
    found = {}
    with connection.cursor() as cursor:
        for name, query in checks.items():
            cursor.execute(query)
            rows = cursor.fetchall()
            if rows:
                found[name] = rows[:10]
    return found


def assert_invariants(*, settled: bool = False) -> None:
    found = violations(settled=settled)
    assert not found, "invariants violated:\n" + "\n".join(
        f"- {name}: {rows}" for name, rows in found.items()
    )
