-- beat --
-- Refresh this worker's heartbeat; no row back means its row is gone (pruned while the
-- worker could not reach the database), and it must register again.
UPDATE procrastinate_workers
   SET last_heartbeat = now()
 WHERE id = %(worker_id)s
RETURNING id;

-- adopt_jobs --
-- After registering again: take back the running jobs that are still ours (left 'doing'
-- with our old id, or with none after the old row was pruned). A job that a recovery
-- already put back to 'todo' (or another worker took) is not ours any more.
UPDATE procrastinate_jobs
   SET worker_id = %(worker_id)s
 WHERE id = ANY(%(job_ids)s)
   AND status = 'doing'
   AND (worker_id IS NULL OR worker_id = %(old_worker_id)s)
RETURNING id;

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
-- recovery took back (because this worker looked dead) is not finished from here.
WITH mine AS (
    SELECT id
      FROM procrastinate_jobs
     WHERE id = %(job_id)s
       AND status = 'doing'
       AND (worker_id = %(worker_id)s OR worker_id IS NULL)
       FOR UPDATE
)
SELECT procrastinate_finish_job_v1(id, %(status)s::procrastinate_job_status, %(delete_job)s)
  FROM mine;

-- retry_job_fenced --
-- procrastinate's retry, only while the job is still this worker's (see finish_job_fenced).
WITH mine AS (
    SELECT id
      FROM procrastinate_jobs
     WHERE id = %(job_id)s
       AND status = 'doing'
       AND (worker_id = %(worker_id)s OR worker_id IS NULL)
       FOR UPDATE
)
SELECT procrastinate_retry_job_v2(id, %(retry_at)s, %(priority)s, %(queue)s, %(lock)s)
  FROM mine;

-- requeue_orphans --
-- Jobs this worker was given but never heard of: the fetch committed, then the connection
-- died before its reply arrived. They never started, so they go back to 'todo' as they
-- were (no attempt counted). Run only while no fetch is in flight.
UPDATE procrastinate_jobs
   SET status = 'todo', worker_id = NULL
 WHERE worker_id = %(worker_id)s
   AND status = 'doing'
   AND NOT (id = ANY(%(running)s))
RETURNING id;
