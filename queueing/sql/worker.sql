-- beat --
-- Refresh this worker's heartbeat; no row back means its row is gone (pruned while the
-- worker could not reach the database), and it must register again.
UPDATE procrastinate_workers
   SET last_heartbeat = now()
 WHERE id = %(worker_id)s
RETURNING id;

-- register_and_adopt --
-- Register again (this worker's row was pruned while it was cut off) and, in the same
-- statement, take back the running jobs that are still ours: left 'doing' with our old
-- id, or with none after the old row was pruned. A job that recovery already put back to
-- 'todo' (or another worker took) is not ours any more. One statement: never a new id
-- without its jobs.
WITH registered AS (
    INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id
), adopted AS (
    UPDATE procrastinate_jobs
       SET worker_id = (SELECT id FROM registered)
     WHERE id = ANY(%(job_ids)s)
       AND status = 'doing'
       AND (worker_id IS NULL OR worker_id = %(old_worker_id)s)
    RETURNING id
)
SELECT (SELECT id FROM registered) AS worker_id,
       coalesce((SELECT array_agg(id) FROM adopted), '{}') AS adopted;

-- prune_dead_workers --
-- Delete worker rows silent for far longer than any live worker can be (a worker exits
-- once the database has been away for its outage window). Silence counts from the later
-- of the last heartbeat and the server's start: nobody could beat while it was down.
-- Their 'doing' jobs keep worker_id NULL, which stalled recovery takes at once.
DELETE FROM procrastinate_workers
 WHERE greatest(last_heartbeat, pg_postmaster_start_time())
       < now() - %(seconds)s * interval '1 second'
RETURNING id;

-- finish_job_fenced --
-- procrastinate's finish, only while the job is still this worker's: a job that stalled
-- recovery took back (because this worker looked dead) is not finished from here. A job
-- failed for good whose task has a give-up hook (%(owed_reason)s not NULL) records, in the
-- same statement, that it owes the hook (pgstage_owed_give_ups): whatever happens to this
-- worker after the commit, some worker's maintenance runs the hook.
WITH mine AS (
    SELECT id, task_name, args
      FROM procrastinate_jobs
     WHERE id = %(job_id)s
       AND status = 'doing'
       AND (worker_id = %(worker_id)s OR worker_id IS NULL)
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

-- orphans --
-- Jobs this worker was given but never heard of: the fetch committed, then the connection
-- died before its reply arrived. They never started. Read only while no fetch is in
-- flight (the fetch loop, after a failed fetch).
SELECT id, task_name, abort_requested
  FROM procrastinate_jobs
 WHERE worker_id = %(worker_id)s
   AND status = 'doing'
   AND NOT (id = ANY(%(running)s))
 ORDER BY id;

-- requeue_orphan --
-- Put one orphan back to 'todo' as it was (no attempt counted). A fresh job holding its
-- SHORT key meanwhile makes this a unique violation: the caller ends it as superseded.
UPDATE procrastinate_jobs
   SET status = 'todo', worker_id = NULL
 WHERE id = %(job_id)s AND status = 'doing' AND worker_id = %(worker_id)s
RETURNING id;
