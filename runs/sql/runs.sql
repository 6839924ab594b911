-- core_create_held --
-- The local core's held run, in one statement of its own (before the admission's lock):
-- count one run against today's (UTC) provider budget of the user's tenant and create the
-- run. No row back once that budget is used up (nor for a user without a tenant), and
-- then nothing was written. The budget row is locked only for this statement, so
-- concurrent admissions of a tenant never wait on each other's whole transaction, and
-- never overshoot the budget. Keyed by tenant: one cannot exhaust another's budget.
-- A budget of 0 is no bound (the runs are still counted).
WITH budget AS (
    INSERT INTO core_daily_usage AS u (tenant_id, day, used)
    SELECT usr.tenant_id, (now() AT TIME ZONE 'UTC')::date, 1
      FROM users usr
     WHERE usr.id = %(user_id)s
       AND usr.tenant_id IS NOT NULL
    ON CONFLICT (tenant_id, day) DO UPDATE SET used = u.used + 1
     WHERE %(budget)s <= 0 OR u.used < %(budget)s
    RETURNING used
)
INSERT INTO core_runs (run_id, user_id, state, sources, error, created_at)
SELECT %(run_id)s, %(user_id)s, 'held', %(sources)s, '', now()
  FROM budget
RETURNING id;

-- core_cancel_held --
-- Cancel a held run that no live job needs and give its budget unit back to the day it
-- was taken from: the provider did no work for it. Two kinds qualify:
--   * a run no job references (its admission was refused, or died before it committed):
--     deleted, as if it never was;
--   * a run whose every job ended without releasing it (cancelled while queued, its
--     release failed for good, its user deactivated): kept, as 'cancelled', so the job
--     still names a row.
-- A run that was released (the provider worked), or one a queued, pending or running job
-- may still release, is left as it is: cancelling twice does nothing. A run an admission
-- is taking right now (its guard holds the row FOR KEY SHARE, and its job is not yet
-- visible here) is skipped, not waited for: that admission commits a job naming it.
-- Returns how many runs it cancelled (0 or 1).
WITH target AS (
    SELECT h.id, h.user_id, h.created_at,
           EXISTS (SELECT 1 FROM analysis_jobs j WHERE j.core_run_id = h.id) AS referenced
      FROM core_runs h
     WHERE h.id = %(core_run_id)s
       AND h.state = 'held'
       AND NOT EXISTS (SELECT 1 FROM analysis_jobs j
                        WHERE j.core_run_id = h.id
                          AND j.status IN ('queued', 'pending', 'running'))
       FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM core_runs c
     USING target t
     WHERE c.id = t.id AND NOT t.referenced
), closed AS (
    UPDATE core_runs c
       SET state = 'cancelled', finished_at = now(),
           error = 'cancelled while held: its job ended without releasing it'
      FROM target t
     WHERE c.id = t.id AND t.referenced
), given_back AS (
    UPDATE core_daily_usage u
       SET used = u.used - 1
      FROM target t
      JOIN users usr ON usr.id = t.user_id
     WHERE u.tenant_id = usr.tenant_id
       AND u.day = (t.created_at AT TIME ZONE 'UTC')::date
       AND u.used > 0
)
SELECT count(*) FROM target;

-- core_stale_held --
-- Held runs that no live job needs: those no job references, older than %(seconds)s (an
-- admission died between creating its held run and committing its job; younger ones may
-- still be committing), and those whose every job ended without releasing them, whatever
-- their age (their job's own cancel missed the core: it was unreachable). Oldest first,
-- bounded.
-- "Some job references it" is a scalar subquery, one index probe per held run: as an EXISTS
-- under the OR the planner may hash it instead (a hashed SubPlan), which reads every job
-- that ever had a run. It did in the bench after a purge of 1M jobs not yet vacuumed:
-- the resume tick took 196 ms a call with the hash, 14 ms with the probes.
SELECT c.id
  FROM core_runs c
 WHERE c.state = 'held'
   AND NOT EXISTS (SELECT 1 FROM analysis_jobs j
                    WHERE j.core_run_id = c.id
                      AND j.status IN ('queued', 'pending', 'running'))
   AND (c.created_at < now() - %(seconds)s * interval '1 second'
        OR (SELECT j.id FROM analysis_jobs j WHERE j.core_run_id = c.id LIMIT 1) IS NOT NULL)
 ORDER BY c.id
 LIMIT %(limit)s;

-- core_abandoned_released --
-- Released or judging runs whose every job ended (failed or cancelled after the release,
-- while the core was unreachable): no attempt will come back to finish them, so they are
-- failed. A run no job references is left alone (its admission may still commit).
-- Oldest first, bounded. As in core_stale_held, what a run's jobs are is asked per run
-- (a scalar subquery, and an EXISTS kept a subplan by its OFFSET 0), never a join that
-- reads every job that ever had a run: the runs are read in order through their partial
-- index, and the ones taken updated by primary key (= ANY of their ids, not a join that
-- may scan every run ever made), whatever the statistics say.
UPDATE core_runs
   SET state = 'failed', finished_at = now(),
       error = 'its analysis ended without finishing it'
 WHERE id = ANY (ARRAY(SELECT c.id
                         FROM core_runs c
                        WHERE c.state IN ('released', 'judging')
                          AND (SELECT j.id FROM analysis_jobs j
                                WHERE j.core_run_id = c.id LIMIT 1) IS NOT NULL
                          AND NOT EXISTS (SELECT 1 FROM analysis_jobs j
                                           WHERE j.core_run_id = c.id
                                             AND j.status IN ('queued', 'pending', 'running')
                                          OFFSET 0)
                        ORDER BY c.id
                        LIMIT %(limit)s
                          FOR UPDATE SKIP LOCKED));

-- admit_checks --
-- The admission's checks, a CTE of the serial queue's admit statement (under the user's
-- lock, so two admits of one user cannot both pass): the balance covers the price, the
-- user has fewer than %(open_limit)s analyses queued, pending or running (0: no bound; one
-- indexed probe of the limit-th, however long the queue), and the user is still active
-- (a deactivation committed while this admission waited for the lock refuses it).
-- The balance is the user's mark (credit_balance_marks, when it was folded on this
-- cluster and its horizon is not in this server's future: a clone whose counter is
-- behind the mark's) plus the entries from its horizon on (balance_tail: one index
-- range, however long the history); balance_tail also sums the entries this statement may fold into a
-- new mark (admit_fold): those of transactions below its own snapshot's xmin, all ended.
balance_mark AS (
    SELECT m.balance, m.horizon, m.entries
      FROM credit_balance_marks m
     WHERE m.user_id = %(user_id)s
       AND m.cluster = (SELECT system_identifier FROM pg_control_system())
       AND m.horizon <= pg_snapshot_xmax(pg_current_snapshot())
), balance_tail AS (
    SELECT coalesce(sum(c.amount), 0) AS amount,
           coalesce(sum(c.amount) FILTER (WHERE c.created_xid < x.horizon), 0) AS settled_amount,
           count(c.amount) FILTER (WHERE c.created_xid < x.horizon) AS settled,
           x.horizon
      FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS horizon) x
      LEFT JOIN credit_ledger c
        ON c.user_id = %(user_id)s
       AND c.created_xid >= coalesce((SELECT m.horizon FROM balance_mark m), '0'::xid8)
     GROUP BY x.horizon
), checks AS (
    SELECT coalesce((SELECT m.balance FROM balance_mark m), 0)
               + (SELECT t.amount FROM balance_tail t) >= %(price)s AS funded,
           (%(open_limit)s <= 0
            OR NOT EXISTS (SELECT 1 FROM analysis_jobs o
                            WHERE o.user_id = %(user_id)s
                              AND o.status IN ('queued', 'pending', 'running')
                              AND o.deleted_at IS NULL
                           OFFSET %(open_limit)s - 1 LIMIT 1)) AS room,
           coalesce((SELECT usr.is_active FROM users usr WHERE usr.id = %(user_id)s), false)
               AS active
)

-- admit_report --
-- Which of admit_checks passed, returned by the admit statement either way: a refusal
-- names its reason as the lock saw it, without a second read.
(SELECT k.funded FROM checks k), (SELECT k.room FROM checks k), (SELECT k.active FROM checks k)

-- admit_local_hold --
-- The local core's held run, created by the admit statement itself once admit_checks
-- passed: one unit of today's (UTC) provider budget of the user's tenant (as
-- core_create_held), then the run. No unit is taken for a refused admission, and none
-- when the budget is used up (no held run: the guard admit_held_created refuses); a
-- budget of 0 is no bound (the runs are still counted). The
-- tenant's budget row is locked from here to the commit, which the same round trip sends:
-- the user's lock is always taken first (every path that takes both takes them in that
-- order).
budget AS (
    INSERT INTO core_daily_usage AS u (tenant_id, day, used)
    SELECT usr.tenant_id, (now() AT TIME ZONE 'UTC')::date, 1
      FROM users usr, checks k
     WHERE usr.id = %(user_id)s
       AND usr.tenant_id IS NOT NULL
       AND k.funded AND k.room AND k.active
    ON CONFLICT (tenant_id, day) DO UPDATE SET used = u.used + 1
     WHERE %(budget)s <= 0 OR u.used < %(budget)s
    RETURNING used
), held AS (
    INSERT INTO core_runs (run_id, user_id, state, sources, error, created_at)
    SELECT %(run_id)s, %(user_id)s, 'held', %(sources)s, '', now()
      FROM budget
    RETURNING id
)

-- admit_held_created --
-- The guard of an admission whose held run admit_local_hold creates: it was created.
EXISTS (SELECT 1 FROM held)

-- admit_held_run --
-- The job's core run, when admit_local_hold created it.
(SELECT h.id FROM held h)

-- admit_guard --
-- The guard of an admission whose held run was created before the lock (a core that
-- cannot join the statement): admit_checks passed, and the held core run is still there
-- and stays (FOR KEY SHARE until commit): the resume tick's expiry may have cancelled it
-- while this admission waited for the lock, and it skips a run this lock holds.
(SELECT k.funded AND k.room AND k.active FROM checks k)
AND EXISTS (SELECT 1 FROM core_runs h
             WHERE h.id = %(core_run_id)s AND h.state = 'held'
               FOR KEY SHARE)

-- admit_charge --
-- The admission's charge, in the serial queue's INSERT statement: one credit for the
-- admitted job (unique per job and kind, so it happens once).
charged AS (
    INSERT INTO credit_ledger (user_id, job_id, kind, amount, note, created_at)
    SELECT %(user_id)s, a.id, 'charge', 0 - %(price)s, 'analysis job ' || a.id, now()
      FROM admitted a
    RETURNING id
)

-- admit_fold --
-- After an admission (never a refused one), fold the user's settled tail into their mark
-- once it holds %(fold_after)s entries or more: the new mark's horizon is this
-- statement's snapshot xmin, and its balance the old mark's plus every tail entry below
-- it (balance_tail). Only admissions write marks, each under the user's lock; the
-- compare-and-set on the horizon read (or on a mark of another cluster, or one above
-- this server's transaction counter, which is replaced) keeps a mark from ever moving
-- back. The charge above is this transaction's, at or above the new horizon: it stays
-- in the tail.
balance_fold AS (
    INSERT INTO credit_balance_marks AS m (user_id, balance, horizon, cluster, entries, folded_at)
    SELECT %(user_id)s, coalesce((SELECT b.balance FROM balance_mark b), 0) + t.settled_amount,
           t.horizon, (SELECT system_identifier FROM pg_control_system()),
           coalesce((SELECT b.entries FROM balance_mark b), 0) + t.settled, now()
      FROM balance_tail t
     WHERE t.settled >= %(fold_after)s
       AND EXISTS (SELECT 1 FROM admitted)
    ON CONFLICT (user_id) DO UPDATE
       SET balance = excluded.balance, horizon = excluded.horizon, cluster = excluded.cluster,
           entries = excluded.entries, folded_at = excluded.folded_at
     WHERE m.cluster IS DISTINCT FROM excluded.cluster
        OR m.horizon > pg_snapshot_xmax(pg_current_snapshot())
        OR m.horizon = (SELECT b.horizon FROM balance_mark b)
    RETURNING 1
)

-- record_run --
-- Record a job's run (either writer) in ONE statement whose ON CONFLICT WHERE is the
-- precedence rule, so two writers racing on the primary key cannot both win. A run ends
-- holding its newest recorded job:
--   * a later job of the run replaces the row, whoever wrote it and whoever writes now;
--   * for the same job, a client save replaces a worker row (saved_by NULL, a legacy
--     row, counts as client); the same job saved again rewrites nothing;
--   * an earlier job never replaces a later one: a stale save (an old tab saving the job
--     a delta re-check has superseded) writes nothing;
--   * a row that names no job (a legacy row, or its job deleted) counts as a client save
--     of the run's newest job: only a client save replaces it.
-- The body is copied from the job inside the statement (never shipped through Python),
-- and only while the job is recordable. No row back = nothing was written.
-- The same statement flags the job run_saved once its run holds it or a later job (this
-- write, or one before it), so the backstop's partial index holds only unsaved jobs and
-- the sweep costs what it finds. Only this job's row is flagged: its row lock is already
-- the writer's, so the flag adds no lock order (older jobs of the run are flagged by the
-- sweep when it meets them).
WITH recorded AS (
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
 WHERE EXCLUDED.job_id > r.job_id
    OR (EXCLUDED.job_id = r.job_id AND EXCLUDED.saved_by = 'client' AND r.saved_by = 'worker')
    OR (r.job_id IS NULL AND EXCLUDED.saved_by = 'client')
RETURNING r.id, r.version, r.tenant_id
), flagged AS (
    UPDATE analysis_jobs j
       SET run_saved = true
     WHERE j.id = %(job_id)s
       AND NOT j.run_saved
       AND (EXISTS (SELECT 1 FROM recorded)
            OR EXISTS (SELECT 1 FROM analysis_runs r
                        WHERE r.id = j.run_id AND (r.job_id >= j.id OR r.job_id IS NULL)))
)
SELECT id, version, tenant_id FROM recorded;

-- unsaved_runs --
-- The backstop sweep's batch: terminal jobs that still hold their body and non-empty
-- results, untouched for the grace period (the browser had its chance), not flagged
-- run_saved (a job counts as saved once its run holds it or a later job; record_run
-- flags it). Oldest first: it is the closest to losing its body to the trim.
-- SKIP LOCKED: two sweeps (an old and a new container during a deploy) take disjoint
-- rows. The partial index analysis_jobs_unsaved_idx holds exactly the unsaved jobs, so a
-- sweep that finds nothing reads nothing, whatever the table's size.
SELECT j.id, j.run_id
  FROM analysis_jobs j
 WHERE j.status IN ('complete', 'failed')
   AND j.deleted_at IS NULL
   AND j.doc_html IS NOT NULL
   AND j.results IS NOT NULL
   AND NOT j.run_saved
   AND j.results <> '{}'::jsonb
   AND j.updated_at < now() - %(grace_seconds)s * interval '1 second'
 ORDER BY j.updated_at ASC
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED;

-- lost_process_jobs --
-- Active analyses idle since %(cutoff)s whose process_job is gone: no job holds its
-- EXCLUSIVE key waiting, retrying or running. One probe of that key in its partial
-- unique index (pgstage_jobs_exclusive_key: the LIKE and the statuses are its predicate)
-- per active job, whatever the statistics say. The key is asked as a range of one value
-- (for text, >= and <= one value is = it), the first of it in the key's order: run under
-- queueing.planner's settings (no sort), the only plan is a probe of that index, the
-- one ordered by the key among those whose predicate the query proves. Asked by =, the
-- planner may walk procrastinate's index of every waiting and running job instead
-- (procrastinate_jobs_id_lock_idx_v1, its predicate the same statuses): it did, for
-- every active analysis, while the statistics said no job waited. Oldest first, bounded.
SELECT j.id
  FROM analysis_jobs j
 WHERE j.status IN ('pending', 'running')
   AND j.deleted_at IS NULL
   AND j.updated_at < %(cutoff)s
   AND (SELECT p.queueing_lock FROM procrastinate_jobs p
         WHERE p.queueing_lock >= %(lock_prefix)s || j.id::text
           AND p.queueing_lock <= %(lock_prefix)s || j.id::text
           AND p.queueing_lock LIKE 'exclusive/%%'
           AND p.status IN ('todo', 'doing')
         ORDER BY p.queueing_lock
         LIMIT 1) IS NULL
 ORDER BY j.updated_at
 LIMIT %(limit)s;

-- resume_work --
-- Which parts of the resume tick have anything to do, in one read-only statement, so a
-- tick with nothing to do is one round trip. Each flag is its part's own batch predicate
-- without the batch's locks, bounds or order (a part that runs re-reads, locks and
-- re-checks what it takes, so a flag that is stale by then costs one empty batch; a row
-- that appears after the probe waits for the next tick, as it would after the batch):
--   expired_releases   expired_releases
--   deactivated        the queued jobs of deactivated users (analysis_jobs_cancel_deactivated)
--   stuck              serial_stuck_keys of the analysis queue (users with queued work
--                      and no active first-pass job)
--   lost               lost_process_jobs
--   held_runs          core_stale_held or core_abandoned_released
-- Three passes, each over live rows only, through the partial indexes that hold them
-- (analysis_jobs_live_idx for queued and active jobs, core_runs_unfinished_idx for
-- unfinished core runs), with one index probe per row (per user, for queued jobs) for
-- what it asks of a table of history: the user's active job
-- (analysis_jobs_one_active_per_user), a process_job's EXCLUSIVE key
-- (pgstage_jobs_exclusive_key, asked as lost_process_jobs asks it, and so run under
-- queueing.planner's settings), a core run's jobs (core_run_id). Each probe is a
-- subplan run per row (an EXISTS kept one by its OFFSET 0, or a scalar subquery), never
-- a join or a hashed subplan that reads every job, or every procrastinate job, that ever
-- was. The users with queued jobs are a join the planner picks (a hash of a few users,
-- or a probe per user among many).
WITH waiting AS (
    SELECT q.user_id, bool_or(q.delta_of_job_id IS NULL) AS first_pass
      FROM analysis_jobs q
     WHERE q.status = 'queued'
       AND q.deleted_at IS NULL
     GROUP BY q.user_id
), queued AS (
    SELECT coalesce(bool_or(NOT u.is_active), false) AS deactivated,
           coalesce(bool_or(w.first_pass
                            AND NOT EXISTS (SELECT 1 FROM analysis_jobs b
                                             WHERE b.user_id = w.user_id
                                               AND b.delta_of_job_id IS NULL
                                               AND b.status IN ('pending', 'running')
                                               AND b.deleted_at IS NULL
                                            OFFSET 0)),
                    false) AS stuck
      FROM waiting w
      JOIN users u ON u.id = w.user_id
), active AS (
    SELECT coalesce(bool_or(j.status = 'running'
                            AND j.released_at IS NULL
                            AND j.release_deadline < now()),
                    false) AS expired_releases,
           coalesce(bool_or(j.updated_at < now() - %(idle_seconds)s * interval '1 second'
                            AND (SELECT p.queueing_lock FROM procrastinate_jobs p
                                  WHERE p.queueing_lock >= %(lock_prefix)s || j.id::text
                                    AND p.queueing_lock <= %(lock_prefix)s || j.id::text
                                    AND p.queueing_lock LIKE 'exclusive/%%'
                                    AND p.status IN ('todo', 'doing')
                                  ORDER BY p.queueing_lock
                                  LIMIT 1) IS NULL),
                    false) AS lost
      FROM analysis_jobs j
     WHERE j.status IN ('pending', 'running')
       AND j.deleted_at IS NULL
), unfinished AS (
    -- live: whether a queued, pending or running job references the run (NULL: no job
    -- does), read by one probe of the run's jobs (a scalar subquery on core_run_id alone:
    -- a status in its WHERE would let the planner walk every live job per run instead),
    -- once per run (the OFFSET 0 keeps r a subquery: its two uses, one evaluation).
    SELECT coalesce(bool_or(CASE WHEN r.live IS NULL
                                 THEN r.state = 'held'
                                      AND r.created_at
                                          < now() - %(held_seconds)s * interval '1 second'
                                 ELSE NOT r.live
                            END),
                    false) AS held_runs
      FROM (SELECT c.state, c.created_at,
                   (SELECT bool_or(j.status IN ('queued', 'pending', 'running'))
                      FROM analysis_jobs j
                     WHERE j.core_run_id = c.id) AS live
              FROM core_runs c
             WHERE c.state IN ('held', 'released', 'judging')
            OFFSET 0) r
)
SELECT a.expired_releases, q.deactivated, q.stuck, a.lost, u.held_runs
  FROM queued q, active a, unfinished u;

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
                       AND (r.job_id >= j.id OR r.job_id IS NULL)))
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
           AND (r.job_id >= j.id OR r.job_id IS NULL))
 ORDER BY j.finished_at
 LIMIT %(limit)s;

-- credit_balance --
-- User %(user_id)s's balance, read as the admission reads it (admit_checks): their mark
-- (when it was folded on this cluster, and not above its transaction counter) plus the
-- entries from its horizon on, both in one snapshot.
WITH balance_mark AS (
    SELECT m.balance, m.horizon
      FROM credit_balance_marks m
     WHERE m.user_id = %(user_id)s
       AND m.cluster = (SELECT system_identifier FROM pg_control_system())
       AND m.horizon <= pg_snapshot_xmax(pg_current_snapshot())
)
SELECT coalesce((SELECT m.balance FROM balance_mark m), 0)
       + coalesce((SELECT sum(c.amount) FROM credit_ledger c
                    WHERE c.user_id = %(user_id)s
                      AND c.created_xid >= coalesce((SELECT m.horizon FROM balance_mark m),
                                                    '0'::xid8)), 0);
