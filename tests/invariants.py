"""docs/design.md#invariants: the invariants the reliability scenarios assert after every run.

Each check is one SQL query returning the offending rows, so a failure names them.
``settled=True`` adds the checks that hold once work has quiesced (every job finished,
grace passed and the sweeps ran). :func:`liveness_violations` are invariant 11: nothing
waits for ever — every unfinished thing has a live job or is due for a named sweep, and
a thing past due is a violation. They hold at any moment while workers run.
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
    "5d. a balance read as the admission reads it (mark + entries since) is the ledger's sum": """
        SELECT l.user_id, l.total, b.read FROM (
               SELECT user_id, sum(amount) AS total FROM credit_ledger GROUP BY 1) l
         CROSS JOIN LATERAL (
               SELECT coalesce(m.balance, 0)
                      + coalesce((SELECT sum(c.amount) FROM credit_ledger c
                                   WHERE c.user_id = l.user_id
                                     AND c.created_xid >= coalesce(m.horizon, '0'::xid8)), 0)
                      AS read
                 FROM (SELECT 1) one
                 LEFT JOIN credit_balance_marks m
                   ON m.user_id = l.user_id
                  AND m.cluster = (SELECT system_identifier FROM pg_control_system())
                  AND m.horizon <= pg_snapshot_xmax(pg_current_snapshot())) b
         WHERE l.total <> b.read""",
    "6a. at most one run per run id (one row per job's run)": """
        SELECT job_id, count(*) FROM analysis_runs WHERE job_id IS NOT NULL
         GROUP BY 1 HAVING count(*) > 1""",
    "6c. a job flagged run_saved is held by its run (it or a later job)": """
        SELECT j.id FROM analysis_jobs j
         WHERE j.run_saved
           AND NOT EXISTS (SELECT 1 FROM analysis_runs r
                            WHERE r.id = j.run_id AND (r.job_id >= j.id OR r.job_id IS NULL))""",
    "7a. every run version is judged at most once": """
        SELECT run_id, version, count(*) FROM run_judgements
         GROUP BY 1, 2 HAVING count(*) > 1""",
}

SETTLED = {
    "6b. every terminal job with doc_html and results is held by its run (or a later job)": """
        SELECT j.id FROM analysis_jobs j
         WHERE j.status IN ('complete', 'failed') AND j.deleted_at IS NULL
           AND j.doc_html IS NOT NULL AND j.results IS NOT NULL
           AND j.results <> '{}'::jsonb
           AND NOT EXISTS (SELECT 1 FROM analysis_runs r
                            WHERE r.id = j.run_id AND (r.job_id >= j.id OR r.job_id IS NULL))""",
    "7b. every recorded run is judged (its current version)": """
        SELECT r.id FROM analysis_runs r
         WHERE NOT EXISTS (SELECT 1 FROM run_judgements g
                            WHERE g.run_id = r.id AND g.version = r.version)""",
    "8. no job is left waiting or running": """
        SELECT id, task_name, status FROM procrastinate_jobs
         WHERE status IN ('todo', 'doing') AND task_name NOT LIKE 'queueing.sweep%%'""",
}


#: Each query takes the periods it allows (seconds) as parameters; see liveness_violations.
LIVENESS = {
    "11a. every active analysis has a live process_job or is due for the resume tick": """
        SELECT j.id, j.status FROM analysis_jobs j
         WHERE j.status IN ('pending', 'running') AND j.deleted_at IS NULL
           AND j.updated_at < now() - %(resume_due)s * interval '1 second'
           AND NOT EXISTS (
                SELECT 1 FROM procrastinate_jobs p
                 WHERE p.task_name = 'runs.process_job' AND p.status IN ('todo', 'doing')
                   AND p.args ->> 'job_id' = j.id::text)""",
    "11b. every user with queued analyses has one active or is due for promotion": """
        SELECT q.user_id, min(q.id) FROM analysis_jobs q
         WHERE q.status = 'queued' AND q.delta_of_job_id IS NULL AND q.deleted_at IS NULL
           AND NOT EXISTS (
                SELECT 1 FROM analysis_jobs b
                 WHERE b.user_id = q.user_id AND b.delta_of_job_id IS NULL
                   AND b.deleted_at IS NULL
                   AND (b.status IN ('pending', 'running')
                        OR b.updated_at > now() - %(resume_due)s * interval '1 second'))
         GROUP BY 1""",
    "11c. every unsaved terminal analysis is recorded within grace and one tick": """
        SELECT j.id FROM analysis_jobs j
         WHERE j.status IN ('complete', 'failed') AND j.deleted_at IS NULL
           AND j.doc_html IS NOT NULL AND j.results IS NOT NULL
           AND j.results <> '{}'::jsonb
           AND j.updated_at < now() - %(save_due)s * interval '1 second'
           AND NOT EXISTS (SELECT 1 FROM analysis_runs r
                            WHERE r.id = j.run_id AND (r.job_id >= j.id OR r.job_id IS NULL))""",
    "11d. no running job belongs to a worker silent past the threshold and one recovery": """
        SELECT j.id, j.task_name, j.worker_id FROM procrastinate_jobs j
          LEFT JOIN procrastinate_workers w ON w.id = j.worker_id
         WHERE j.status = 'doing'
           AND (w.id IS NULL
                OR greatest(w.last_heartbeat, pg_postmaster_start_time())
                   < now() - %(stall_due)s * interval '1 second')""",
    "11g. every give-up hook a failed job owes runs within one maintenance period": """
        SELECT o.job_id, o.task_name FROM pgstage_owed_give_ups o
         WHERE o.created_at < now() - %(owed_due)s * interval '1 second'""",
    "11f. every stage that can run has a live job or is due for the pipeline_resume sweep": """
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


def _sweep_period(sweep) -> float:
    return sweep.every_seconds if sweep.inline else _period_seconds(sweep.cron)


def _last_run_age(cursor, sweep) -> float | None:
    """Seconds since the sweep last ran: an inline sweep's own record, a job sweep's
    latest tick whose job succeeded (deferred is not enough: it must have run)."""
    if sweep.inline:
        cursor.execute(
            "SELECT extract(epoch FROM now() - last_run) FROM pgstage_inline_sweeps "
            "WHERE name = %s",
            [sweep.name],
        )
    else:
        cursor.execute(
            "SELECT extract(epoch FROM now()) - max(d.defer_timestamp) "
            "FROM procrastinate_periodic_defers d "
            "JOIN procrastinate_jobs j ON j.id = d.job_id AND j.status = 'succeeded' "
            "WHERE d.task_name = %s",
            [sweep.tick_name],
        )
    row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


def _period_seconds(cron: str) -> float:
    from croniter import croniter

    it = croniter(cron, 0)
    first = it.get_next(float)
    return it.get_next(float) - first


def liveness_violations(
    *,
    stall_seconds: float | None = None,
    recovery_seconds: float | None = None,
    slack_seconds: float = 5.0,
    workers_up_seconds: float | None = None,
) -> dict[str, list[tuple]]:
    """Invariant 11 (docs/design.md#invariants) at this moment. The periods default to the
    settings of this process; a scenario whose workers run with other settings passes theirs.

    ``workers_up_seconds`` (how long workers have been running) adds "every sweep has a
    live tick" for each sweep whose period fits in that time: its latest tick is at most
    one period (and the slack) old. An hourly sweep cannot be judged after a minute."""
    from django.conf import settings

    from queueing.sweeps import sweeps

    stall = stall_seconds if stall_seconds is not None else settings.QUEUEING_STALLED_WORKER_SECONDS
    recovery = (
        recovery_seconds
        if recovery_seconds is not None
        else settings.QUEUEING_STALLED_RECOVERY_SECONDS
    )
    declared = sweeps()
    resume = declared["analysis_resume"]
    unsaved = declared["unsaved_runs"]
    stages = declared["pipeline_resume"]
    params = {
        "pipeline_resume_due_seconds": stages.grace_seconds
        + _period_seconds(stages.cron)
        + slack_seconds,
        "stall_due": stall + recovery + slack_seconds,
        "owed_due": recovery + slack_seconds,
        "resume_due": resume.grace_seconds + _period_seconds(resume.cron) + slack_seconds,
        "save_due": unsaved.grace_seconds + _period_seconds(unsaved.cron) + slack_seconds,
    }
    found = {}
    with connection.cursor() as cursor:
        for name, query in LIVENESS.items():
            cursor.execute(query, params)
            rows = cursor.fetchall()
            if rows:
                found[name] = rows[:10]
        if workers_up_seconds is not None:
            late = [
                (sweep.name, age)
                for sweep in declared.values()
                if not sweep.func.__module__.startswith("tests.")  # workers do not know them
                and (period := _sweep_period(sweep)) + slack_seconds <= workers_up_seconds
                and ((age := _last_run_age(cursor, sweep)) is None or age > period + slack_seconds)
            ]
            if late:
                found["11e. every sweep has a live tick (it ran within its period)"] = late
    return found


def assert_live(**kwargs) -> None:
    found = liveness_violations(**kwargs)
    assert not found, "liveness violated:\n" + "\n".join(
        f"- {name}: {rows}" for name, rows in found.items()
    )


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
