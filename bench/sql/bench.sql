-- last_job_id --
-- The newest job id: a batch's jobs are the ones after it.
SELECT coalesce(max(id), 0) FROM procrastinate_jobs;

-- job_span --
-- A batch seen from procrastinate's events (database clock): jobs done, jobs that failed
-- or were retried, the first start and the last end. Worker start-up is not in it.
SELECT count(*) FILTER (WHERE e.type = 'succeeded') AS done,
       count(*) FILTER (WHERE e.type IN ('failed', 'deferred_for_retry', 'cancelled',
                                         'aborted')) AS broken,
       min(e.at) FILTER (WHERE e.type = 'started') AS first_start,
       max(e.at) FILTER (WHERE e.type = 'succeeded') AS last_end
  FROM procrastinate_jobs j
  JOIN procrastinate_events e ON e.job_id = j.id
 WHERE j.id > %(after)s
   AND j.queue_name = ANY(%(queues)s)
   AND j.task_name = ANY(%(tasks)s);

-- job_end --
-- When the job of this task whose args contain these ended well (database clock).
SELECT max(e.at)
  FROM procrastinate_jobs j
  JOIN procrastinate_events e ON e.job_id = j.id AND e.type = 'succeeded'
 WHERE j.id > %(after)s
   AND j.task_name = %(task)s
   AND j.args @> %(args)s::jsonb;

-- job_broken --
-- Jobs after the mark that failed or were retried (a batch that cannot finish).
SELECT count(*)
  FROM procrastinate_jobs j
  JOIN procrastinate_events e ON e.job_id = j.id
 WHERE j.id > %(after)s
   AND e.type IN ('failed', 'deferred_for_retry', 'cancelled', 'aborted');

-- park_jobs --
-- Move a batch's new jobs to a queue no worker takes (inside the batch's transaction).
UPDATE procrastinate_jobs
   SET queue_name = %(parked)s
 WHERE id > %(after)s
   AND status = 'todo'
   AND task_name = ANY(%(tasks)s);

-- release_jobs --
-- Hand a parked batch to its queue (no insert trigger: the workers are woken by notify_queue).
UPDATE procrastinate_jobs SET queue_name = %(queue)s WHERE queue_name = %(parked)s;

-- notify_queue --
-- Wake the workers of a queue, as procrastinate's insert trigger does.
SELECT pg_notify('procrastinate_queue_v1#' || %(queue)s,
                 json_build_object('type', 'job_inserted', 'job_id', %(job_id)s)::text);

-- now --
SELECT clock_timestamp();

-- listening_workers --
-- Worker processes of a group (PGAPPNAME names each one) whose LISTEN session is up.
SELECT DISTINCT application_name
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name LIKE %(prefix)s
   AND query ILIKE %(listen)s;

-- delete_bench_jobs --
-- The harness's own jobs (queues bench*), events and stall counts cascading.
DELETE FROM procrastinate_jobs WHERE queue_name LIKE %(pattern)s;

-- delete_batch --
-- Every job a batch created (its jobs, their next hops), once it is measured: each batch
-- meets the same job table, not one grown by the batches before it.
DELETE FROM procrastinate_jobs WHERE id > %(after)s AND status <> 'doing';
DELETE FROM bench_steps;

-- vacuum_jobs --
-- What autovacuum does between a deployment's bursts, done at once: the dead rows a
-- measured batch left (its jobs, their events, its steps) leave the table and its indexes,
-- so each batch, and each side of a comparison, starts on the same table. (The machine's
-- server runs with autovacuum off; without this, the side measured second walked the
-- first side's dead index entries.)
VACUUM procrastinate_jobs, procrastinate_events, bench_steps;

-- analyze_jobs --
-- What autovacuum's analyse gives a burst within its first minute, done at once, in the
-- transaction that enqueues a measured batch (ANALYZE counts that transaction's own new
-- rows): both sides meet statistics that know the batch. procrastinate's own fetch plans
-- by them: with the statistics vacuum_jobs leaves (a handful of rows, the table emptied),
-- it took 340 ms per fetch at 1,000 waiting jobs (its lock check a nested loop over the
-- priority index), and the baseline ran one job a second. pgstage's fetch does not
-- depend on them (queueing/planner.py).
ANALYZE procrastinate_jobs;

-- delete_ticks_since --
-- The periodic ticks the harness's workers deferred (every worker runs the periodic
-- deferrer, whatever queues it takes); nothing of the harness's ever runs them.
DELETE FROM procrastinate_jobs
 WHERE id > %(after)s
   AND status = 'todo'
   AND task_name LIKE 'queueing.sweep_tick.%%';

-- saved_jobs_insert --
-- Terminal analysis jobs that still hold their body and results, past the sweep's grace
-- (oldest first, one millisecond apart), each saved by the client: their run holds them
-- and they are flagged run_saved, as record_run leaves them.
-- The shape of "saved" is the schema's: when it changes, this block and the next change
-- with it (the scenario refuses to time a sweep that finds work).
INSERT INTO analysis_jobs (tenant_id, user_id, run_id, status, title, doc_html, sources,
                           results, error, release_attempts, requeues, run_saved, created_at,
                           updated_at, started_at, finished_at)
SELECT %(tenant)s, %(user)s, gen_random_uuid(), 'complete', 'bench ' || g, %(body)s,
       '[]'::jsonb, %(results)s::jsonb, '', 0, 0, true, t, t, t, t
  FROM (SELECT g, now() - interval '1 hour' - (%(count)s - g) * interval '1 millisecond' AS t
          FROM generate_series(1, %(count)s) AS g) AS series;

-- saved_runs_insert --
-- The client's save of each job inserted above (one run per job, holding it).
INSERT INTO analysis_runs (id, tenant_id, user_id, job_id, title, doc_html, results,
                           saved_by, version, created_at, updated_at)
SELECT j.run_id, j.tenant_id, j.user_id, j.id, j.title, j.doc_html, j.results, 'client', 1,
       j.updated_at, j.updated_at
  FROM analysis_jobs j
 WHERE j.user_id = %(user)s
   AND j.id > %(after)s;

-- last_analysis_job_id --
SELECT coalesce(max(id), 0) FROM analysis_jobs;

-- finished_jobs_insert --
-- Jobs that ran and succeeded long ago (no trigger fires for a row born 'succeeded').
INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts)
SELECT %(queue)s, 'bench.noop', jsonb_build_object('unit', g), 'succeeded', 1
  FROM generate_series(1, %(count)s) AS g;

-- backdate_jobs --
-- Move the users' analysis jobs back in time (as if untouched for that long).
UPDATE analysis_jobs
   SET updated_at = updated_at - %(seconds)s * interval '1 second'
 WHERE user_id = ANY(%(users)s);

-- analyze_queue_tables --
-- The tables the resume sweep reads as autovacuum keeps them in a steady production:
-- fresh planner statistics (a table just filled has none: the planner guesses), and the
-- dead rows of earlier runs' purged tenants gone (the machine's server runs with
-- autovacuum off: on a database three full runs old, the idle sweep took 11.5 ms a call
-- against 4.4 ms on a fresh one).
VACUUM (ANALYZE) analysis_jobs, core_runs, users, procrastinate_jobs;

-- purge_procrastinate_jobs --
-- The jobs that name a bench tenant's analysis jobs or inquiries.
DELETE FROM procrastinate_jobs
 WHERE (task_name LIKE 'runs.%%'
        AND args ? 'job_id'
        AND (args->>'job_id')::bigint IN (SELECT id FROM analysis_jobs
                                           WHERE tenant_id = %(tenant)s))
    OR (task_name LIKE 'pipeline.%%'
        AND args ? 'anfrage_id'
        AND (args->>'anfrage_id')::bigint IN (SELECT id FROM anfragen
                                               WHERE tenant_id = %(tenant)s));

-- purge_runs --
DELETE FROM run_judgements
 WHERE run_id IN (SELECT id FROM analysis_runs WHERE tenant_id = %(tenant)s);
DELETE FROM job_citations
 WHERE job_id IN (SELECT id FROM analysis_jobs WHERE tenant_id = %(tenant)s);
DELETE FROM analysis_runs WHERE tenant_id = %(tenant)s;
-- An erase of the credit ledger (append-only, runs.0012): deactivated users, marks first.
UPDATE users SET is_active = false WHERE tenant_id = %(tenant)s;
DELETE FROM credit_balance_marks
 WHERE user_id IN (SELECT id FROM users WHERE tenant_id = %(tenant)s);
DELETE FROM credit_ledger
 WHERE user_id IN (SELECT id FROM users WHERE tenant_id = %(tenant)s);
DELETE FROM analysis_jobs WHERE tenant_id = %(tenant)s;
DELETE FROM core_runs
 WHERE user_id IN (SELECT id FROM users WHERE tenant_id = %(tenant)s);
DELETE FROM core_daily_usage WHERE tenant_id = %(tenant)s;
DELETE FROM analysis_audit WHERE tenant_id = %(tenant)s;

-- purge_pipeline --
DELETE FROM audit_log WHERE tenant_id = %(tenant)s;
DELETE FROM pipeline_runs WHERE tenant_id = %(tenant)s;
DELETE FROM anfrage_positions WHERE tenant_id = %(tenant)s;
DELETE FROM anfrage_warnings WHERE tenant_id = %(tenant)s;
DELETE FROM anfrage_files WHERE tenant_id = %(tenant)s;
DELETE FROM anfragen WHERE tenant_id = %(tenant)s;

-- purge_accounts --
DELETE FROM api_tokens
 WHERE user_id IN (SELECT id FROM users WHERE tenant_id = %(tenant)s);
DELETE FROM users WHERE tenant_id = %(tenant)s;
DELETE FROM tenants WHERE id = %(tenant)s;

-- sustained_jobs --
-- A sustained run's jobs of one task and queue, each with its unit (``<tag>-<n>``: the n-th
-- of the offering's schedule) and from procrastinate's events (database clock): when it
-- was deferred, when it first started, when it ended well (NULL: not yet).
SELECT j.args ->> 'unit' AS unit,
       min(e.at) FILTER (WHERE e.type = 'deferred') AS deferred_at,
       min(e.at) FILTER (WHERE e.type = 'started') AS started_at,
       max(e.at) FILTER (WHERE e.type = 'succeeded') AS ended_at
  FROM procrastinate_jobs j
  JOIN procrastinate_events e ON e.job_id = j.id
 WHERE j.id > %(after)s
   AND j.queue_name = %(queue)s
   AND j.task_name = %(task)s
 GROUP BY j.id;

-- sustained_open --
-- How many of a sustained run's jobs of one task and queue have not ended yet (the wait's
-- poll: the job table only, by its primary key).
SELECT count(*)
  FROM procrastinate_jobs
 WHERE id > %(after)s
   AND queue_name = %(queue)s
   AND task_name = %(task)s
   AND status IN ('todo', 'doing');

-- analyze_events --
-- Statistics that know a sustained run's jobs and events before they are read: with the
-- ones of an emptied table (autovacuum off) the read below joined them by a nested loop
-- over every event, for minutes.
ANALYZE procrastinate_jobs, procrastinate_events;

-- sustained_insert --
-- One tick's jobs of the sustained-load scenario, in one statement for either side, so the
-- offering never limits the rate: the INSERT procrastinate's defer and pgstage's enqueue
-- both run (the job table's triggers — NOTIFY, events — fire as for them).
INSERT INTO procrastinate_jobs (queue_name, task_name, queueing_lock, args)
SELECT %(queue)s, %(task)s, l.lock, jsonb_build_object('unit', l.unit)
  FROM unnest(%(units)s::text[], %(locks)s::text[]) AS l(unit, lock);

-- doing_after --
-- Jobs after the mark that a worker is running.
SELECT count(*) FROM procrastinate_jobs WHERE id > %(after)s AND status = 'doing';

-- ledger_entries --
-- %(entries)s grants of one credit for user %(user)s: a long history, written at once.
INSERT INTO credit_ledger (user_id, kind, amount, note, created_at)
SELECT %(user)s, 'grant', 1, 'bench history', now() - n * interval '1 second'
  FROM generate_series(1, %(entries)s) AS n;

-- group_sessions --
-- The server sessions of a group's worker processes (PGAPPNAME names each one): their
-- backends' pids, whose CPU the harness reads from /proc when the server is local.
SELECT pid
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name LIKE %(prefix)s;

-- group_busy --
-- How many of a group's server sessions have been running one statement for more than
-- half a second (a fetch still at work on a backlog the harness has already removed).
SELECT count(*)
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND application_name LIKE %(prefix)s
   AND state = 'active'
   AND now() - query_start > interval '0.5 seconds';
