-- advisory_xact_lock --
-- Take a transaction-level advisory lock on namespace:key (blocking).
SELECT pg_advisory_xact_lock(hashtextextended(%(namespace)s || ':' || %(key)s, 0));

-- try_advisory_xact_lock --
-- Take a transaction-level advisory lock on namespace:key if it is free.
SELECT pg_try_advisory_xact_lock(hashtextextended(%(namespace)s || ':' || %(key)s, 0));

-- enqueue --
-- Insert a procrastinate job unless a unique index (queueing lock, exclusive key) already
-- holds one; then return that job instead. Mirrors procrastinate_defer_jobs_v1's INSERT;
-- the job table's triggers (NOTIFY, events) fire as for procrastinate's own defer.
WITH inserted AS (
    INSERT INTO procrastinate_jobs (queue_name, task_name, priority, queueing_lock, args, scheduled_at)
    VALUES (%(queue)s, %(task_name)s, %(priority)s, %(queueing_lock)s, %(args)s, %(scheduled_at)s)
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT id, true AS created FROM inserted
UNION ALL
SELECT id, false AS created
  FROM procrastinate_jobs
 WHERE %(queueing_lock)s::text IS NOT NULL
   AND queueing_lock = %(queueing_lock)s
   AND status = ANY(%(statuses)s::procrastinate_job_status[])
   AND NOT EXISTS (SELECT 1 FROM inserted)
LIMIT 1;

-- enqueue_lookup --
-- Find the job that holds a queueing lock (second statement, fresh snapshot).
SELECT id
  FROM procrastinate_jobs
 WHERE queueing_lock = %(queueing_lock)s
   AND status = ANY(%(statuses)s::procrastinate_job_status[])
 ORDER BY id
 LIMIT 1;

-- stalled_jobs --
-- Jobs in 'doing' whose worker stopped heart-beating (or was pruned), oldest first.
-- Silence counts from the latest of the last heartbeat, the server's start and when
-- recovery resumed after a gap (NULL when run by hand): while the server was down or
-- recovery could not run, no worker could beat, and a live one beats again at once.
-- SKIP LOCKED: two recoveries never take the same job.
SELECT j.id, j.task_name, j.queueing_lock, j.args, j.abort_requested, j.worker_id
  FROM procrastinate_jobs j
  LEFT JOIN procrastinate_workers w ON w.id = j.worker_id
 WHERE j.status = 'doing'
   AND (w.id IS NULL
        OR greatest(w.last_heartbeat, pg_postmaster_start_time(), %(resumed_at)s::timestamptz)
           < now() - %(seconds)s * interval '1 second')
 ORDER BY j.id
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED;

-- count_stall --
-- Count one more stall of this job (apart from procrastinate's attempts, which count the
-- task's own failures and retries): the stall budget is spent only by dead workers.
INSERT INTO pgstage_job_stalls AS s (job_id, stalls, last_stalled_at, last_worker_id)
VALUES (%(job_id)s, 1, now(), %(worker_id)s)
ON CONFLICT (job_id) DO UPDATE
   SET stalls = s.stalls + 1, last_stalled_at = now(), last_worker_id = EXCLUDED.last_worker_id
RETURNING stalls;

-- requeue_stalled_job --
-- Put a stalled job back to 'todo', attempts unchanged (its worker died; the task did not
-- fail), and wake the workers as procrastinate's insert trigger would (it does not fire on
-- an UPDATE). Its run's deadline goes: the next run gets a whole timeout. A queueing-lock
-- collision raises a unique violation (issues 1446/1543).
WITH requeued AS (
    UPDATE procrastinate_jobs
       SET status = 'todo', worker_id = NULL
     WHERE id = %(job_id)s AND status = 'doing' AND NOT abort_requested
    RETURNING id, queue_name, json_build_object('type', 'job_inserted', 'job_id', id)::text AS payload
), forgotten AS (
    DELETE FROM pgstage_job_deadlines WHERE job_id IN (SELECT id FROM requeued)
)
SELECT id,
       pg_notify('procrastinate_queue_v1#' || queue_name, payload),
       pg_notify('procrastinate_any_queue_v1', payload)
  FROM requeued;

-- end_stalled_job --
-- End a stalled job for good ('failed', or 'aborted' when an abort was requested) and, in
-- the same statement, record that it owes its task's give-up hook (%(owed_reason)s not
-- NULL; a superseded job owes nothing): some worker that has the hook runs it
-- (queueing.giveup.settle_owed), whichever worker ran this recovery.
WITH ended AS (
    SELECT id, task_name, args,
           procrastinate_finish_job_v1(id, %(status)s::procrastinate_job_status, false)
      FROM procrastinate_jobs
     WHERE id = %(job_id)s
), owed AS (
    INSERT INTO pgstage_owed_give_ups (job_id, task_name, args, reason)
    SELECT id, task_name, args, %(owed_reason)s::text
      FROM ended
     WHERE %(owed_reason)s::text IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
)
SELECT id FROM ended;

-- timed_out_jobs --
-- Runs past their deadline (queueing.timeouts) by more than %(grace)s s, of tasks this
-- process knows (%(known)s: their retry strategy decides), oldest deadline first. The
-- deadline counts from no earlier than when recovery resumed after a gap (as silence
-- does in stalled_jobs): a run that ended while the database was away is given the grace
-- to save its own outcome. A run is judged by the later of its own deadline and its polls'
-- (run_deadline, NULL when a worker of an earlier release fetched it: its deadline is the
-- run's), so a run fetched again after its polls' deadline has its whole timeout.
-- Only the run whose fetch wrote the row is judged by it (d.worker_id; NULL: a row of the
-- previous release): a row left by a dead run, which a worker of the release before job
-- timeouts put back without deleting it and fetched again at the same attempt, is no
-- deadline of that worker's run, nor is a row a poll released (migration 0012). A row
-- whose run_deadline is not the one written with them (owned_run_deadline) was fetched
-- last by a worker of the previous release, which writes neither: judged as it was
-- (migration 0013).
-- SKIP LOCKED: two recoveries never take the same job.
SELECT j.id, j.status, j.task_name, j.priority, j.lock, j.queueing_lock, j.args,
       j.scheduled_at, j.queue_name, j.attempts, j.abort_requested, j.worker_id
  FROM procrastinate_jobs j
  JOIN pgstage_job_deadlines d ON d.job_id = j.id AND d.attempts = j.attempts
 WHERE j.status = 'doing'
   AND (d.owned_run_deadline IS DISTINCT FROM d.run_deadline
        OR (NOT d.polled
            AND (d.worker_id IS NULL OR j.worker_id IS NULL OR d.worker_id = j.worker_id)))
   AND j.task_name = ANY(%(known)s::varchar[])
   AND greatest(d.deadline, d.run_deadline, %(resumed_at)s::timestamptz)
       < now() - %(grace)s * interval '1 second'
 ORDER BY greatest(d.deadline, d.run_deadline), j.id
 LIMIT %(limit)s
   FOR UPDATE OF j SKIP LOCKED;

-- retry_timed_out_job --
-- procrastinate's retry of a run that timed out (one more attempt, at %(retry_at)s), and
-- a wake-up as in requeue_stalled_job. The hung run's own outcome is then refused: its
-- attempt is over (worker.sql, finish_job_fenced). A queueing-lock collision raises a
-- unique violation (issues 1446/1543).
WITH retried AS (
    SELECT id, queue_name, json_build_object('type', 'job_inserted', 'job_id', id)::text AS payload,
           procrastinate_retry_job_v2(id, %(retry_at)s, %(priority)s, %(queue)s, %(lock)s)
      FROM procrastinate_jobs
     WHERE id = %(job_id)s AND status = 'doing'
)
SELECT id,
       pg_notify('procrastinate_queue_v1#' || queue_name, payload),
       pg_notify('procrastinate_any_queue_v1', payload)
  FROM retried;

-- ledger_claim --
-- Claim a stage in one statement: insert, or take over a row that is not 'success' and
-- not held by a live holder. A holder is live while its lease runs and, when it claimed
-- inside a job (holder_job_id), while that job is 'doing' and is not the claimer's own:
-- stalled recovery taking the holder's job back from a dead worker (to 'todo', or to a
-- new run, which may be this claimer) ends the lease on recovery's own clock, long before
-- the lease would run out. The CASE/UNION reports why nothing was claimed; a row that
-- committed after this statement's snapshot is invisible here and reported as busy.
-- A claimer that is a pgstage worker's run (%(run_worker_id)s, %(run_attempts)s; NULL:
-- not one) claims only while its job is 'doing' as that run: a run whose job was taken
-- back (recovered, timed out, or its fetch lost with a server that crashed before the
-- fetch reached the disk, claims_first) as of this statement's snapshot claims nothing
-- and hears 'gone'. One taken back later holds a claim whose holder job is no longer
-- its run: the next run takes it over (holder_job_id = its own job), after which the
-- old run's complete is stale; before it, that complete saves the stage, never the job.
WITH run AS (
    SELECT %(run_worker_id)s::bigint IS NULL
           OR EXISTS (SELECT 1
                        FROM procrastinate_jobs j
                       WHERE j.id = %(job_id)s
                         AND j.status = 'doing'
                         AND (j.worker_id = %(run_worker_id)s::bigint OR j.worker_id IS NULL)
                         AND j.attempts = %(run_attempts)s) AS live
), claimed AS (
    INSERT INTO {table} AS r ({keys}, status, attempts, input_hash, started_at,
                              lease_expires_at, finished_at, error, holder_job_id)
    SELECT {values}, 'running', 1, %(input_hash)s, now(),
           now() + %(lease_seconds)s * interval '1 second', NULL, '', %(job_id)s
      FROM run
     WHERE run.live
    ON CONFLICT ({keys}) DO UPDATE
       SET status = 'running',
           attempts = r.attempts + 1,
           input_hash = EXCLUDED.input_hash,
           started_at = now(),
           lease_expires_at = EXCLUDED.lease_expires_at,
           finished_at = NULL,
           error = '',
           holder_job_id = EXCLUDED.holder_job_id
     WHERE r.status <> 'success'
       AND (r.status <> 'running'
            OR r.lease_expires_at < now()
            OR r.holder_job_id = %(job_id)s
            OR (r.holder_job_id IS NOT NULL
                AND NOT EXISTS (SELECT 1
                                  FROM procrastinate_jobs j
                                 WHERE j.id = r.holder_job_id AND j.status = 'doing')))
    RETURNING r.id, r.attempts
)
SELECT 'claimed' AS outcome, id, attempts FROM claimed
UNION ALL
SELECT 'gone', NULL, NULL FROM run WHERE NOT run.live
UNION ALL
SELECT CASE WHEN status = 'success' THEN 'done' ELSE 'busy' END, id, attempts
  FROM {table}
 WHERE ({keys}) = ({values})
   AND NOT EXISTS (SELECT 1 FROM claimed)
   AND (SELECT live FROM run);

-- ledger_complete --
-- Compare-and-set on the fencing token: only the current holder closes the row. Only when
-- it closed the row, in the same statement (one round trip, one commit):
--   * %(enqueue)s: the next job's INSERT, enqueue's (the columns procrastinate's defer
--     inserts; a test keeps all of them equal); a job that already holds the key is left
--     as it is (ON CONFLICT DO NOTHING: never an error);
--   * %(finish)s: the holder's own job saved 'succeeded', as the worker would save it after
--     the task returned (procrastinate's finish, fenced as finish_job_fenced is: only while
--     the job is still this worker's run, %(worker_id)s at %(attempts)s). A job recovery
--     took back meanwhile is left to its new run, which finds the stage done. From here to
--     the caller's COMMIT the job's row is locked (stalled recovery skips it, a prune waits
--     for it): the rest of the transaction may idle no longer than %(idle_ms)s, so a
--     worker that vanished before its COMMIT (a lost host, a cut network) releases it then,
--     instead of when the server's TCP keepalive notices.
-- Back come the row's id, the enqueued job's id (NULL: none, or deduplicated) and whether
-- the holder's job was finished here. No row: the token is stale.
WITH completed AS (
    UPDATE {table}
       SET status = 'success', finished_at = now(), lease_expires_at = NULL, error = ''
     WHERE id = %(id)s AND attempts = %(token)s AND status = 'running'
    RETURNING id
), enqueued AS (
    INSERT INTO procrastinate_jobs (queue_name, task_name, priority, queueing_lock, args, scheduled_at)
    SELECT %(queue)s, %(task_name)s, %(priority)s, %(queueing_lock)s, %(args)s, %(scheduled_at)s
      FROM completed
     WHERE %(enqueue)s
    ON CONFLICT DO NOTHING
    RETURNING id
), mine AS (
    SELECT j.id
      FROM procrastinate_jobs j
     WHERE %(finish)s
       AND j.id = %(job_id)s
       AND j.status = 'doing'
       AND (j.worker_id = %(worker_id)s OR j.worker_id IS NULL)
       AND j.attempts = %(attempts)s
       AND EXISTS (SELECT 1 FROM completed)
       FOR UPDATE OF j
), finished AS (
    SELECT id, procrastinate_finish_job_v1(id, 'succeeded', %(delete_job)s) AS done,
           set_config('idle_in_transaction_session_timeout', %(idle_ms)s, true) AS bounded
      FROM mine
)
SELECT c.id, (SELECT id FROM enqueued), EXISTS (SELECT 1 FROM finished)
  FROM completed c;

-- ledger_prerequisite --
-- The status and token of the row a unit of work builds on (e.g. the stage before, of the
-- same unit), share-locked: a transaction that reopens or re-closes it waits for the
-- caller's, and a lock that waited for one reads the row as it committed.
SELECT status, attempts
  FROM {table}
 WHERE ({keys}) = ({values})
   FOR SHARE;

-- ledger_fail --
-- Compare-and-set on the fencing token; the row stays claimable for the retry.
UPDATE {table}
   SET status = 'failed', finished_at = now(), lease_expires_at = NULL, error = %(error)s
 WHERE id = %(id)s AND attempts = %(token)s AND status = 'running'
RETURNING id;

-- serial_admit --
-- Insert a row whose status is decided under the key's advisory lock (taken by the
-- statement before this one, in the same transaction: this statement's snapshot is taken
-- after the lock, so it sees every row the lock's previous holder committed): 'queued'
-- when a first-pass sibling is active OR already queued (a late admit never jumps the
-- queue, even when the slot was freed without a promotion), else the start status.
-- created/updated come from the clock under the lock, so FIFO order is admission order.
-- {before} are the caller's CTEs ahead of the INSERT (they may read "siblings"), {guard}
-- the caller's condition (e.g. a balance check; it may read the {before} CTEs): false
-- inserts nothing. {computed} are the caller's SQL values of further columns (e.g. the id
-- a {before} CTE created). When the slot is free but older rows wait (it was freed
-- without a promotion: a crash, an operator), the oldest is promoted in this statement.
-- {then} are the caller's further writes as CTEs over the inserted row ("admitted"),
-- {start_job} the job each started row gets (serial_admit_start_job). Always one row
-- back: the row (NULL when refused), how many older rows wait (its queue position
-- follows), the promoted row, and the caller's {report} values.
WITH siblings AS (
    SELECT coalesce(bool_or(b.{status} = ANY(%(active)s)), false) AS active,
           count(*) FILTER (WHERE b.{status} = %(queued)s) AS waiting
      FROM {table} b
     WHERE b.{key} = %(key)s
       AND b.{parent} IS NULL
       AND (b.{status} = ANY(%(active)s) OR b.{status} = %(queued)s)
       AND (NOT %(has_deleted)s OR b.{deleted} IS NULL)
){before}, admitted AS (
    INSERT INTO {table} ({columns}{computed_columns}, {created}, {updated}, {status})
    SELECT {placeholders}{computed}, clock_timestamp(), clock_timestamp(),
           CASE WHEN s.active OR s.waiting > 0 THEN %(queued)s ELSE %(start)s END
      FROM siblings s
     WHERE {guard}
    RETURNING {pk}, {status}
), promoted AS (
    UPDATE {table} p SET {status} = %(start)s, {updated} = clock_timestamp()
     WHERE NOT %(is_child)s
       AND p.{pk} = (SELECT o.{pk} FROM {table} o
                      WHERE o.{key} = %(key)s AND o.{status} = %(queued)s
                        AND o.{parent} IS NULL
                        AND (NOT %(has_deleted)s OR o.{deleted} IS NULL)
                      ORDER BY o.{created}, o.{pk}
                      LIMIT 1)
       AND EXISTS (SELECT 1 FROM admitted)
       AND EXISTS (SELECT 1 FROM siblings s WHERE s.waiting > 0 AND NOT s.active)
    RETURNING p.{pk}
){then}{start_job}
SELECT a.{pk}, a.{status}, s.waiting, (SELECT p.{pk} FROM promoted p){report}
  FROM siblings s LEFT JOIN admitted a ON true;

-- serial_admit_start_job --
-- The job of each row serial_admit started (the admitted row born with the start status,
-- and the promoted one), in the same statement: enqueue's INSERT, the row's id added to
-- the job's args under %(job_id_arg)s and appended to its queueing lock's prefix (NULL:
-- no lock). A job already holding the key is left as it is (never an error).
, started_jobs AS (
    INSERT INTO procrastinate_jobs (queue_name, task_name, priority, queueing_lock, args, scheduled_at)
    SELECT %(job_queue)s, %(job_task_name)s, %(job_priority)s,
           %(job_lock_prefix)s::text || r.id::text,
           %(job_args)s::jsonb || jsonb_build_object(%(job_id_arg)s::text, r.id),
           NULL
      FROM (SELECT a.{pk} AS id FROM admitted a WHERE a.{status} = %(start)s
            UNION ALL
            SELECT p.{pk} FROM promoted p) r
    ON CONFLICT DO NOTHING
    RETURNING id
)

-- serial_promote --
-- Under the key's lock: the oldest queued row becomes the start status, only when no
-- first-pass sibling is active. The outer status check re-tests the row after any wait,
-- so a row cancelled meanwhile (without the lock) is never started.
UPDATE {table} SET {status} = %(start)s, {updated} = now()
 WHERE {status} = %(queued)s
   AND {pk} = (
        SELECT {pk} FROM {table}
         WHERE {key} = %(key)s AND {status} = %(queued)s AND {parent} IS NULL
           AND (NOT %(has_deleted)s OR {deleted} IS NULL)
         ORDER BY {created}, {pk}
         LIMIT 1)
   AND NOT EXISTS (
        SELECT 1 FROM {table} b
         WHERE b.{key} = %(key)s AND b.{parent} IS NULL
           AND b.{status} = ANY(%(active)s)
           AND (NOT %(has_deleted)s OR b.{deleted} IS NULL))
RETURNING {pk};

-- serial_stuck_keys --
-- Keys with queued work and no active first-pass row (the resume tick promotes them).
SELECT DISTINCT q.{key}
  FROM {table} q
 WHERE q.{status} = %(queued)s AND q.{parent} IS NULL
   AND (NOT %(has_deleted)s OR q.{deleted} IS NULL)
   AND NOT EXISTS (
        SELECT 1 FROM {table} b
         WHERE b.{key} = q.{key} AND b.{parent} IS NULL
           AND b.{status} = ANY(%(active)s)
           AND (NOT %(has_deleted)s OR b.{deleted} IS NULL))
 LIMIT %(limit)s;

-- finished_jobs --
-- Jobs that ended well (not failed) and saw no event within the retention period. Only
-- the oldest finished jobs are looked at (ids grow with time; the partial index
-- pgstage_jobs_finished_idx serves them in order), so a sweep with nothing to delete reads
-- one bounded batch, not days of jobs; a job that finished late waits for the next run.
-- SKIP LOCKED keeps two retention sweeps on disjoint jobs.
SELECT j.id
  FROM (SELECT id
          FROM procrastinate_jobs
         WHERE status IN ('succeeded', 'cancelled', 'aborted')
         ORDER BY id
         LIMIT %(limit)s) AS oldest
  JOIN procrastinate_jobs j ON j.id = oldest.id
 WHERE j.status IN ('succeeded', 'cancelled', 'aborted')
   AND NOT EXISTS (
        SELECT 1 FROM procrastinate_events e
         WHERE e.job_id = j.id
           AND e.at >= now() - %(seconds)s * interval '1 second')
 ORDER BY j.id
   FOR UPDATE OF j SKIP LOCKED;

-- delete_finished_job --
-- Delete one finished job (its events cascade); re-checks the status.
DELETE FROM procrastinate_jobs
 WHERE id = %(job_id)s AND status IN ('succeeded', 'cancelled', 'aborted');

-- bound_transaction --
-- SET LOCAL both timeouts (set_config with is_local = true), as bound parameters.
SELECT set_config('statement_timeout', %(ms)s, true),
       set_config('idle_in_transaction_session_timeout', %(ms)s, true);

-- job_for_operator --
-- One job, row-locked for an operator's action, with whether its worker is alive: the
-- silence rule of stalled_jobs, counting from when recovery last resumed (read under
-- recovery's try-lock, after the caller moved its clock: queueing.sweeps.watch).
SELECT j.id, j.status, j.task_name, j.queueing_lock, j.args, j.abort_requested, j.worker_id,
       w.id IS NOT NULL
       AND greatest(w.last_heartbeat, pg_postmaster_start_time(), c.resumed_at)
           >= now() - %(seconds)s * interval '1 second' AS worker_alive
  FROM procrastinate_jobs j
  LEFT JOIN procrastinate_workers w ON w.id = j.worker_id
  LEFT JOIN pgstage_inline_sweeps c ON c.name = %(clock)s
 WHERE j.id = %(job_id)s
   FOR UPDATE OF j;

-- key_holder --
-- The live job that holds this singleton key (waiting; or running, for an exclusive key).
SELECT id
  FROM procrastinate_jobs
 WHERE queueing_lock = %(queueing_lock)s
   AND id <> %(job_id)s
   AND (status = 'todo' OR (status = 'doing' AND queueing_lock LIKE 'exclusive/%%'))
 ORDER BY id
 LIMIT 1;

-- retry_failed_job --
-- procrastinate's retry of a failed job, at once. In the same statement, the give-up it
-- still owes (recorded when it failed, not yet settled by a process that has its hook)
-- is withdrawn: the job is no longer given up, and its hook run behind (or during) the new
-- run would settle a domain row that is being worked on. Failing again records it anew.
-- The workers are woken as procrastinate's insert trigger would (it does not fire on an
-- UPDATE), so the job starts within LISTEN latency, not at the next poll.
WITH withdrawn AS (
    DELETE FROM pgstage_owed_give_ups WHERE job_id = %(job_id)s
), retried AS (
    SELECT procrastinate_retry_job_v2(%(job_id)s, now(), NULL, NULL, NULL)
), woken AS (
    SELECT queue_name, json_build_object('type', 'job_inserted', 'job_id', id)::text AS payload
      FROM procrastinate_jobs
     WHERE id = %(job_id)s AND EXISTS (SELECT FROM retried)
)
SELECT pg_notify('procrastinate_queue_v1#' || queue_name, payload),
       pg_notify('procrastinate_any_queue_v1', payload)
  FROM woken;

-- cancel_waiting_job --
-- Cancel a job only while it waits and, in the same statement, record that it owes its
-- task's give-up hook (%(owed_reason)s not NULL). Back comes the job's task name.
WITH cancelled AS (
    UPDATE procrastinate_jobs
       SET status = 'cancelled'
     WHERE id = %(job_id)s AND status = 'todo'
    RETURNING id, task_name, args
), owed AS (
    INSERT INTO pgstage_owed_give_ups (job_id, task_name, args, reason)
    SELECT id, task_name, args, %(owed_reason)s::text
      FROM cancelled
     WHERE %(owed_reason)s::text IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
)
SELECT task_name FROM cancelled;

-- inline_sweep_clock --
-- Under an inline sweep's try-lock: record this run; when the previous one was longer ago
-- than %(gap)s seconds (Sweep.resume_gap_seconds: the database, or every
-- worker, was away), record that the sweep resumed now. Returns when it last resumed,
-- whether that is now, and how long ago the previous run was (NULL for the first run).
WITH previous AS (
    SELECT last_run FROM pgstage_inline_sweeps WHERE name = %(name)s
)
INSERT INTO pgstage_inline_sweeps AS s (name, last_run, resumed_at)
VALUES (%(name)s, now(), now())
ON CONFLICT (name) DO UPDATE
   SET resumed_at = CASE WHEN s.last_run < now() - %(gap)s * interval '1 second'
                         THEN now() ELSE s.resumed_at END,
       last_run = now()
RETURNING resumed_at,
          coalesce((SELECT last_run FROM previous) < now() - %(gap)s * interval '1 second',
                   true) AS resumed_now,
          extract(epoch FROM now() - (SELECT last_run FROM previous)) AS unwatched_seconds;

-- take_owed_give_up --
-- One give-up still owed (this job's, or the oldest) of a task this process has the hook
-- of (%(hooked)s), or knows without one (%(known)s) while no worker that may be alive
-- registered that hook: a worker of another release, or with other task modules, leaves
-- the row for one that has the hook. A worker may be alive until it has been silent for
-- %(seconds)s s (queueing.worker.prune_after_seconds: longer than any live worker can be,
-- counting from the server's start): after an outage every heartbeat is old, and the
-- hook's worker beats again only a moment after the return. Taken for the caller's transaction,
-- which runs the hook (if this process has it): committed, the hook ran once; rolled back
-- (the worker died), the row is back for the next run. SKIP LOCKED: two workers never
-- run one hook.
DELETE FROM pgstage_owed_give_ups
 WHERE job_id = (SELECT owed.job_id
                   FROM pgstage_owed_give_ups AS owed
                  WHERE (%(job_id)s::bigint IS NULL OR owed.job_id = %(job_id)s::bigint)
                    AND (owed.task_name = ANY(%(hooked)s::text[])
                         OR (owed.task_name = ANY(%(known)s::text[])
                             AND NOT EXISTS (
                                SELECT 1
                                  FROM pgstage_worker_tasks AS t
                                  JOIN procrastinate_workers AS w ON w.id = t.worker_id
                                 WHERE owed.task_name = ANY(t.hooks)
                                   AND greatest(w.last_heartbeat, pg_postmaster_start_time())
                                       >= now() - %(seconds)s * interval '1 second')))
                  ORDER BY owed.created_at, owed.job_id
                  LIMIT 1
                    FOR UPDATE SKIP LOCKED)
RETURNING job_id, task_name, args, reason;

-- unrunnable_tasks --
-- Waiting jobs that no live worker takes, per task name: no live worker has the task, or
-- none that has it listens to the job's queue (workers register their task names and
-- queues, NULL for all, in pgstage_worker_tasks; a worker is live when it beat within
-- %(seconds)s s, its silence counted as stalled recovery counts it: from no earlier than
-- the server's start and when recovery, %(clock)s, resumed after a gap — after an outage
-- every heartbeat is old, and live workers beat again a moment after the return). A worker fetches only its own tasks' jobs of its own queues, so these
-- wait for a worker that takes them. A worker of a release before pgstage_worker_tasks
-- registers no names and counts for none.
-- Its cost does not grow with the jobs that have a worker (pgstage_jobs_todo_by_task_idx):
-- a loose index scan reads each distinct (task, queue) of the waiting jobs once (one
-- index descent each; PostgreSQL has no skip scan), and only the pairs no live worker
-- takes are counted, from the index alone. Under queueing.planner's settings (no sort
-- where a plan without one exists), where that walk is its only plan whatever the
-- statistics say.
WITH RECURSIVE waiting AS (
    (SELECT task_name, queue_name
       FROM procrastinate_jobs
      WHERE status = 'todo'
      ORDER BY task_name, queue_name
      LIMIT 1)
    UNION ALL
    SELECT next.task_name, next.queue_name
      FROM waiting
     CROSS JOIN LATERAL (
        SELECT task_name, queue_name
          FROM procrastinate_jobs
         WHERE status = 'todo'
           AND (task_name, queue_name) > (waiting.task_name, waiting.queue_name)
         ORDER BY task_name, queue_name
         LIMIT 1) AS next
), live AS (
    SELECT t.task_names, t.queues
      FROM pgstage_worker_tasks t
      JOIN procrastinate_workers w ON w.id = t.worker_id
      LEFT JOIN pgstage_inline_sweeps c ON c.name = %(clock)s
     WHERE greatest(w.last_heartbeat, pg_postmaster_start_time(), c.resumed_at)
           >= now() - %(seconds)s * interval '1 second'
), unserved AS (
    SELECT waiting.task_name, waiting.queue_name
      FROM waiting
     WHERE NOT EXISTS (
        SELECT 1
          FROM live
         WHERE waiting.task_name = ANY(live.task_names)
           AND (live.queues IS NULL OR waiting.queue_name = ANY(live.queues)))
)
SELECT unserved.task_name,
       sum(pair.jobs)::bigint AS jobs,
       min(pair.oldest) AS oldest_job_id,
       array_agg(unserved.queue_name ORDER BY unserved.queue_name) AS queues
  FROM unserved
 CROSS JOIN LATERAL (
    SELECT count(*) AS jobs, min(id) AS oldest
      FROM procrastinate_jobs
     WHERE status = 'todo'
       AND task_name = unserved.task_name
       AND queue_name = unserved.queue_name) AS pair
 GROUP BY unserved.task_name
 ORDER BY unserved.task_name;
