-- fetch_job --
-- pgstage_fetch_job_v1 (queueing/migrations/0015_fetch_job_function.py, which holds its statement),
-- under queueing.planner's settings (the function's own SET clauses): procrastinate_fetch_job_v2
-- (procrastinate 3.10) for only the task names this worker has
-- (%(task_names)s), as pg-boss and Oban workers subscribe by name. A job of a task it
-- lacks (a newer release's task during a rolling deploy, other PGSTAGE_TASK_MODULES)
-- waits for a worker that has it, instead of being fetched and failed for good
-- (TaskNotFound). Each job is judged by procrastinate's conditions word for word, and the
-- job taken is the one procrastinate's fetch would take among this worker's tasks
-- (tests/queueing/test_fetch.py keeps both so). One row, all NULL when no job is ready.
--
-- Its cost does not grow with the waiting jobs, however many wait for other tasks or
-- queues (pgstage_jobs_todo_by_task_idx: the waiting jobs by task, queue, priority, id):
-- waiting: the distinct (task, queue) of the waiting jobs, each with its first job in
--   procrastinate's order, one index descent each (a loose index scan; PostgreSQL has
--   no skip scan);
-- mine: those this worker takes (its task names, its queues);
-- tops: each one's first ready job in procrastinate's order, read without a lock: its
--   first waiting job, looked up by id, when that one is ready (no schedule ahead, no
--   lock held); else a walk past it in that order;
-- candidate: the first of those in that order, locked (SKIP LOCKED), each looked up by
--   id, the next only when one is taken;
-- contended: only when another fetch in flight holds every such top: each pair's first
--   job that is free, locked, then the first of those.
-- Jobs of other tasks or queues are never read. Within a pair, jobs scheduled for later
-- or held behind a lock are walked past, as procrastinate's fetch walks past them.
-- procrastinate's lock check is guarded (CASE WHEN jobs.lock IS NULL THEN true ELSE NOT
-- EXISTS … END: the same condition, which the planner cannot turn into an anti-join).
-- It runs under queueing.planner's settings (no sort where a plan without one exists,
-- no JIT), where the walk of the index is the only plan of the loose scan, whatever the
-- table's statistics say: a burst after a quiet spell, which the statistics still take
-- for a handful of jobs, is fetched from as cheaply. Only the walk past a first job
-- that is not ready is planned by the statistics.
-- In the same statement, the run's deadline (queueing.timeouts) for a task with a bound
-- (%(timeout_tasks)s, %(timeout_seconds)s), on the database's clock: every run gets a
-- fresh run_deadline, by which recovery judges it hung; deadline bounds the polls, so the
-- same attempt fetched again after a PollLater keeps its own (waiting on a busy holder is
-- bounded by the timeout too), and a new attempt gets a fresh one. Only a row a poll
-- released (polled) keeps it: a row of the same attempt left by a run that died, which a
-- worker of the release before job timeouts put back without deleting it, is that run's
-- (migration 0012). worker_id: whose run the row is. owned_run_deadline: the run_deadline
-- written with them (a fetch of the previous release rewrites run_deadline alone: the row
-- is then judged as that release judged it, migration 0013).
--
-- A job of a task declared claims_first (%(unflushed)s, queueing.flush) commits its start
-- without waiting for the flush to disk: synchronous_commit off for this statement's own
-- commit only (set_config's local scope ends with it); the claim that is the task's
-- first step commits after it, and its flush carries the fetch's. Any other job, or none,
-- leaves the setting as it is.
--
-- Only for a worker whose last beat (or the server's start) is younger than
-- %(beat_seconds)s (queueing.worker.fetch_beat_seconds), judged here, on the server's
-- clock, when the statement runs: a fetch held on the way (a link that heals, a
-- retransmission) may reach the server long after the worker sent it, and a job it took
-- would sit under a heartbeat that stalled recovery (the same expression) already counts
-- as dead. Otherwise the function gets no task name, and takes nothing (the row is all
-- NULL). As the function's argument, the check is evaluated once, before it runs; a
-- LATERAL join gated on it cost twice as much.
SELECT id, status, task_name, priority, lock, queueing_lock, args, scheduled_at, queue_name,
       attempts, worker_id,
       set_config('synchronous_commit',
                  CASE WHEN task_name = ANY(%(unflushed)s::varchar[]) THEN 'off'
                       ELSE current_setting('synchronous_commit') END,
                  true) AS synchronous_commit
  FROM pgstage_fetch_job_v1(
           %(queues)s::varchar[], %(worker_id)s::bigint,
           CASE WHEN EXISTS (SELECT 1 FROM procrastinate_workers w
                              WHERE w.id = %(worker_id)s::bigint
                                AND greatest(w.last_heartbeat, pg_postmaster_start_time())
                                    > now() - %(beat_seconds)s::float8 * interval '1 second')
                THEN %(task_names)s::varchar[]
                ELSE '{}'::varchar[] END,
           %(timeout_tasks)s::varchar[], %(timeout_seconds)s::float8[]);

-- register_worker --
-- procrastinate's registration, and in the same statement the task names this worker
-- has, the queues it listens to (%(queues)s, NULL for all) and the tasks it has a give-up
-- hook of (%(hooks)s) (pgstage_worker_tasks, deleted with the worker's row): what tells a
-- job that no live worker takes (queueing.jobs.unrunnable_tasks), and which owed hook a
-- worker without it must leave (queueing.giveup.settle_owed).
WITH registered AS (
    SELECT worker_id FROM procrastinate_register_worker_v1()
), tasks AS (
    INSERT INTO pgstage_worker_tasks (worker_id, task_names, queues, hooks)
    SELECT worker_id, %(task_names)s::text[], %(queues)s::text[], %(hooks)s::text[]
      FROM registered
)
SELECT worker_id FROM registered;

-- beat --
-- Refresh this worker's heartbeat; no row back means its row is gone (pruned while the
-- worker could not reach the database), and it must register again. In the same
-- statement, count this worker's hung runs (%(running)s ids at %(attempts)s): runs whose
-- deadline is %(grace)s s past (the later of the run's and its polls', as recovery judges
-- it: timed_out_jobs), or whose attempt recovery already ended as timed out (a row of
-- this worker's fetch: another's is a dead run's, migration 0012); and
-- record them with its slots, for /metrics and worker_health.
WITH beat AS (
    UPDATE procrastinate_workers
       SET last_heartbeat = now()
     WHERE id = %(worker_id)s
    RETURNING id
), hung AS (
    SELECT count(*)::integer AS slots
      FROM unnest(%(running)s::bigint[], %(attempts)s::integer[]) AS run (job_id, attempts)
      JOIN pgstage_job_deadlines d ON d.job_id = run.job_id
     WHERE (d.owned_run_deadline IS DISTINCT FROM d.run_deadline
            OR ((d.worker_id IS NULL OR d.worker_id = %(worker_id)s) AND NOT d.polled))
       AND (d.attempts <> run.attempts
            OR greatest(d.deadline, d.run_deadline) < now() - %(grace)s * interval '1 second')
), recorded AS (
    UPDATE pgstage_worker_tasks
       SET slots = %(slots)s, hung_slots = (SELECT slots FROM hung)
     WHERE worker_id = (SELECT id FROM beat)
)
SELECT beat.id, hung.slots AS hung FROM beat, hung;

-- register_and_adopt --
-- Register again (this worker's row was pruned while it was cut off) and, in the same
-- statement, take back the running jobs that are still ours: left 'doing' with our old
-- id, or with none after the old row was pruned, and their runs' deadlines. A job that recovery already put back to
-- 'todo' (or another worker took) is not ours any more. One statement: never a new id
-- without its jobs. Only when the old row is gone: a caller that saw a stale id (a fetch
-- sent with the id the worker had before it registered again) changes nothing, and gets
-- the old id back with registered false.
WITH registered AS (
    INSERT INTO procrastinate_workers (last_heartbeat)
    SELECT now()
     WHERE NOT EXISTS (SELECT 1 FROM procrastinate_workers WHERE id = %(old_worker_id)s)
    RETURNING id
), tasks AS (
    INSERT INTO pgstage_worker_tasks (worker_id, task_names, queues, hooks)
    SELECT id, %(task_names)s::text[], %(queues)s::text[], %(hooks)s::text[]
      FROM registered
), adopted AS (
    UPDATE procrastinate_jobs
       SET worker_id = (SELECT id FROM registered)
     WHERE id = ANY(%(job_ids)s)
       AND status = 'doing'
       AND (worker_id IS NULL OR worker_id = %(old_worker_id)s)
       AND EXISTS (SELECT 1 FROM registered)
    RETURNING id
), deadlines AS (
    UPDATE pgstage_job_deadlines
       SET worker_id = (SELECT id FROM registered)
     WHERE job_id IN (SELECT id FROM adopted) AND worker_id = %(old_worker_id)s
)
SELECT coalesce((SELECT id FROM registered), %(old_worker_id)s) AS worker_id,
       EXISTS (SELECT 1 FROM registered) AS registered,
       coalesce((SELECT array_agg(id) FROM adopted), '{}') AS adopted;

-- prune_dead_workers --
-- Delete worker rows silent for far longer than any live worker can be (a worker exits
-- once the database has been away for its outage window). Silence counts from the later
-- of the last heartbeat and the server's start: nobody could beat while it was down.
-- Their 'doing' jobs keep worker_id NULL, which stalled recovery takes at once. A job row
-- another transaction holds (a dead worker's session the server has not ended yet) would
-- hold the ON DELETE SET NULL, and a starting worker with it: the statement waits at most
-- %(lock_timeout_ms)s for a lock (lock_timeout, set before the first row is deleted), and
-- then fails; the caller leaves the prune to a later start.
WITH bounded AS MATERIALIZED (
    SELECT set_config('lock_timeout', %(lock_timeout_ms)s, true) AS ms
)
DELETE FROM procrastinate_workers
 WHERE (SELECT ms FROM bounded) IS NOT NULL
   AND greatest(last_heartbeat, pg_postmaster_start_time())
       < now() - %(seconds)s * interval '1 second'
RETURNING id;

-- finish_job_fenced --
-- procrastinate's finish, only while the job is still this worker's: a job that stalled
-- recovery took back (because this worker looked dead) is not finished from here, nor is
-- one whose run recovery ended as timed out (its attempt, %(attempts)s, is over; NULL: a
-- job that never ran). A job
-- failed for good whose task has a give-up hook (%(owed_reason)s not NULL) records, in the
-- same statement, that it owes the hook (pgstage_owed_give_ups): whatever happens to this
-- worker after the commit, some worker's maintenance runs the hook.
WITH mine AS (
    SELECT id, task_name, args
      FROM procrastinate_jobs
     WHERE id = %(job_id)s
       AND status = 'doing'
       AND (worker_id = %(worker_id)s OR worker_id IS NULL)
       AND (%(attempts)s::integer IS NULL OR attempts = %(attempts)s)
       FOR UPDATE
), finished AS (
    SELECT id, task_name, args,
           procrastinate_finish_job_v1(id, %(status)s::procrastinate_job_status,
                                       %(delete_job)s) AS done
      FROM mine
), owed AS (
    INSERT INTO pgstage_owed_give_ups (job_id, task_name, args, reason)
    SELECT id, task_name, args, %(owed_reason)s::text
      FROM finished
     WHERE %(owed_reason)s::text IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
)
SELECT id FROM finished;

-- retry_job_fenced --
-- procrastinate's retry, only while the job is still this worker's (see finish_job_fenced).
-- procrastinate ends a job whose abort was requested 'failed' instead of retrying it:
-- that is a give-up, and records the owed hook in this statement (%(abort_reason)s not
-- NULL: its task has a hook). Back comes whether it was aborted.
WITH mine AS (
    SELECT id, task_name, args, abort_requested
      FROM procrastinate_jobs
     WHERE id = %(job_id)s
       AND status = 'doing'
       AND (worker_id = %(worker_id)s OR worker_id IS NULL)
       AND (%(attempts)s::integer IS NULL OR attempts = %(attempts)s)
       FOR UPDATE
), retried AS (
    SELECT id, task_name, args, abort_requested,
           procrastinate_retry_job_v2(id, %(retry_at)s, %(priority)s, %(queue)s, %(lock)s)
      FROM mine
), owed AS (
    INSERT INTO pgstage_owed_give_ups (job_id, task_name, args, reason)
    SELECT id, task_name, args, %(abort_reason)s::text
      FROM retried
     WHERE abort_requested AND %(abort_reason)s::text IS NOT NULL
    ON CONFLICT (job_id) DO NOTHING
)
SELECT id, abort_requested FROM retried;

-- poll_job_fenced --
-- Put the job back to wait until %(retry_at)s without counting an attempt: its run did
-- not fail, the work is held by another live holder (queueing.exceptions.PollLater).
-- Only while the job is still this worker's, at this attempt, no abort was requested and
-- the run's deadline (queueing.timeouts), which its polls share, has not passed (no row
-- back: the caller then saves it as a failed attempt, which ends an aborted job). Its
-- deadline row is marked polled: the next fetch of this attempt keeps its deadline.
WITH polled AS (
UPDATE procrastinate_jobs
   SET status = 'todo', scheduled_at = %(retry_at)s
 WHERE id = %(job_id)s
   AND status = 'doing'
   AND NOT abort_requested
   AND (worker_id = %(worker_id)s OR worker_id IS NULL)
   AND attempts = %(attempts)s
   AND NOT EXISTS (
       SELECT 1 FROM pgstage_job_deadlines d
        WHERE d.job_id = %(job_id)s AND d.attempts = %(attempts)s AND d.deadline <= now())
RETURNING id
), kept AS (
    UPDATE pgstage_job_deadlines
       SET polled = true
     WHERE job_id IN (SELECT id FROM polled) AND attempts = %(attempts)s
)
SELECT id FROM polled;

-- orphans --
-- Jobs 'doing' under this worker that it does not run: a fetch committed, then the
-- connection died before its reply arrived (they never started); or a second fetch of a
-- job the worker still ran, whose first run's outcome was refused. Read only while no
-- fetch of the worker is in flight (after a failed fetch; before a fetch).
SELECT id, task_name, abort_requested
  FROM procrastinate_jobs
 WHERE worker_id = %(worker_id)s
   AND status = 'doing'
   AND NOT (id = ANY(%(running)s))
 ORDER BY id;

-- requeue_orphan --
-- Put one orphan back to 'todo' as it was (no attempt counted; its deadline goes, since
-- it never ran). A fresh job holding its SHORT key meanwhile makes this a unique
-- violation: the caller ends it as superseded.
WITH requeued AS (
    UPDATE procrastinate_jobs
       SET status = 'todo', worker_id = NULL
     WHERE id = %(job_id)s AND status = 'doing' AND worker_id = %(worker_id)s
    RETURNING id
), forgotten AS (
    DELETE FROM pgstage_job_deadlines WHERE job_id IN (SELECT id FROM requeued)
)
SELECT id FROM requeued;
