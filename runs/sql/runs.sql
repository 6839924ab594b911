-- core_budget_take --
-- Count one core run against today's (UTC) provider budget of the user's tenant; no row
-- comes back once that budget is used up (nor for a user without a tenant). One
-- statement, so concurrent admissions never overshoot it, and it rolls back with a
-- refused admission. Keyed by tenant: one tenant cannot exhaust another's budget.
INSERT INTO core_daily_usage AS u (tenant_id, day, used)
SELECT usr.tenant_id, (now() AT TIME ZONE 'UTC')::date, 1
  FROM users usr
 WHERE usr.id = %(user_id)s
   AND usr.tenant_id IS NOT NULL
   AND %(budget)s > 0
ON CONFLICT (tenant_id, day) DO UPDATE SET used = u.used + 1
 WHERE u.used < %(budget)s
RETURNING used;

-- record_run --
-- Record a job's run (either writer) in ONE statement whose ON CONFLICT WHERE is the
-- precedence rule, so two writers racing on the primary key cannot both win:
--   * a client save beats a worker row (of any job of the run) and replaces a client row
--     only for a later job of the same run; the same job saved again rewrites nothing;
--   * a worker save never overwrites a client row or a legacy row (saved_by NULL counts
--     as client); it replaces a worker row only for a later job of the same run.
-- The body is copied from the job inside the statement (never shipped through Python),
-- and only while the job is recordable. No row back = nothing was written.
INSERT INTO analysis_runs AS r
       (id, tenant_id, user_id, job_id, title, doc_html, results, saved_by, version,
        created_at, updated_at)
SELECT j.run_id, j.tenant_id, j.user_id, j.id, j.title, j.doc_html, j.results,
       %(saved_by)s, 1, clock_timestamp(), clock_timestamp()
  FROM analysis_jobs j
 WHERE j.id = %(job_id)s
   AND j.status IN ('complete', 'failed')
   AND j.deleted_at IS NULL
   AND j.doc_html IS NOT NULL
   AND j.results IS NOT NULL
   AND j.results <> '{}'::jsonb
ON CONFLICT (id) DO UPDATE
   SET job_id = EXCLUDED.job_id,
       title = EXCLUDED.title,
       doc_html = EXCLUDED.doc_html,
       results = EXCLUDED.results,
       saved_by = EXCLUDED.saved_by,
       version = r.version + 1,
       updated_at = clock_timestamp()
 WHERE CASE EXCLUDED.saved_by
           WHEN 'client' THEN r.saved_by = 'worker' OR r.job_id < EXCLUDED.job_id
           ELSE r.saved_by = 'worker' AND r.job_id < EXCLUDED.job_id
       END
RETURNING r.id, r.version;

-- unsaved_runs --
-- The backstop sweep's batch: terminal jobs that still hold their body and non-empty
-- results, untouched for the grace period (the browser had its chance), whose run is
-- missing — or is a worker row of an earlier job of the same run (precedence lets this
-- job replace it). Oldest first: it is the closest to losing its body to the trim.
-- SKIP LOCKED: two sweeps (an old and a new container during a deploy) take disjoint
-- rows. The partial index analysis_jobs_unsaved_idx serves the scan and the order; the
-- run lookup is an anti-join on the runs' primary key (the seed's LEFT JOIN … IS NULL,
-- written as NOT EXISTS so the precedence condition keeps it an anti-join).
SELECT j.id, j.run_id
  FROM analysis_jobs j
 WHERE j.status IN ('complete', 'failed')
   AND j.deleted_at IS NULL
   AND j.doc_html IS NOT NULL
   AND j.results IS NOT NULL
   AND j.results <> '{}'::jsonb
   AND j.updated_at < now() - %(grace_seconds)s * interval '1 second'
   AND NOT EXISTS (
        SELECT 1 FROM analysis_runs r
         WHERE r.id = j.run_id
           AND NOT COALESCE(r.saved_by = 'worker' AND r.job_id < j.id, false))
 ORDER BY j.updated_at ASC
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED;

-- expired_releases --
-- Running jobs whose held core run was never released and whose release window has
-- closed: the resume tick fails them and refunds their credit. SKIP LOCKED passes over
-- a job whose process_job is attempting the release right now (it decides itself).
SELECT j.id
  FROM analysis_jobs j
 WHERE j.status = 'running'
   AND j.deleted_at IS NULL
   AND j.released_at IS NULL
   AND j.release_deadline < now()
 ORDER BY j.release_deadline
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED;

-- trim_doc_html --
-- Clear the body of jobs that ended more than %(hours)s ago, in one bounded statement,
-- except from a job that still lacks its run (the complement of unsaved_runs' filter
-- without the grace): losing that body would lose the run for good. A run row is never
-- deleted, so a job judged "saved" here stays saved.
WITH batch AS (
    SELECT j.id
      FROM analysis_jobs j
     WHERE j.doc_html IS NOT NULL
       AND j.finished_at IS NOT NULL
       AND j.finished_at < now() - %(hours)s * interval '1 hour'
       AND NOT (j.status IN ('complete', 'failed')
                AND j.deleted_at IS NULL
                AND j.results IS NOT NULL
                AND j.results <> '{}'::jsonb
                AND NOT EXISTS (
                    SELECT 1 FROM analysis_runs r
                     WHERE r.id = j.run_id
                       AND NOT COALESCE(r.saved_by = 'worker' AND r.job_id < j.id, false)))
     ORDER BY j.finished_at
     LIMIT %(limit)s
       FOR UPDATE OF j SKIP LOCKED
)
UPDATE analysis_jobs j
   SET doc_html = NULL, updated_at = clock_timestamp()
  FROM batch
 WHERE j.id = batch.id
RETURNING j.id;

-- untrimmable_unsaved --
-- Jobs past the trim age that the trim must keep because their run is still missing
-- (the backstop sweep should have recorded them: each one is worth a warning).
SELECT j.id
  FROM analysis_jobs j
 WHERE j.doc_html IS NOT NULL
   AND j.finished_at IS NOT NULL
   AND j.finished_at < now() - %(hours)s * interval '1 hour'
   AND j.status IN ('complete', 'failed')
   AND j.deleted_at IS NULL
   AND j.results IS NOT NULL
   AND j.results <> '{}'::jsonb
   AND NOT EXISTS (
        SELECT 1 FROM analysis_runs r
         WHERE r.id = j.run_id
           AND NOT COALESCE(r.saved_by = 'worker' AND r.job_id < j.id, false))
 ORDER BY j.finished_at
 LIMIT %(limit)s;
