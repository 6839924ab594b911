"""The worker's fetch as a function: ``pgstage_fetch_job_v1``.

The fetch (``queueing.worker.TaskNameJobManager.fetch_job``) is one statement that
PostgreSQL must plan under settings of its own (``queueing.planner``: no sort where a
plan without one exists, no JIT, no sequential scan, hash or merge join, and its generic
plan). Sent as a statement, those settings travelled before it in a pipeline on every
fetch, and its 8 KB of text with it: a second statement to bind and run, and a text too
long for psycopg to cache its conversion. As a PL/pgSQL function the settings are the
function's own (its ``SET`` clauses, in force while it runs and undone after), the
statement's plan is made once per server session and kept (a generic plan: it must fit a
later burst as well as the quiet table it was made on), also behind a transaction
pooler, where nothing was prepared and the fetch was planned on every run; and the
worker sends one short statement.

The body is procrastinate's fetch for the worker's task names, word for word as the
statement it replaces (tests/queueing/test_fetch.py reads it from the installed function
and holds it to procrastinate's conditions). Its parameters, in order: the queues (NULL:
all), the worker's id, its task names, and the tasks with a timeout and their seconds
(``queueing.timeouts``). Each column it returns is cast to the type it declares, so a
migration that widens one of them (procrastinate's, in an upgrade) leaves it working: the
server replans its statement, and what the worker receives keeps its types. The status
goes as text (psycopg hands procrastinate's enum to Python as a string either way), so the
function does not depend on procrastinate's type, which an upgrade may rebuild. The function
is versioned: a change to it is a new function (``_v2``) in a new migration, and this one
stays while a release that calls it may still run (a rolling deploy), so no migration
ever changes what an older worker calls.
"""

from __future__ import annotations

from django.db import migrations

SETTINGS = (
    "SET enable_sort = off SET jit = off SET enable_seqscan = off SET enable_hashjoin = off "
    "SET enable_mergejoin = off SET plan_cache_mode = force_generic_plan"
)

FETCH = (
    """
CREATE OR REPLACE FUNCTION pgstage_fetch_job_v1(
    target_queue_names character varying[],
    fetching_worker_id bigint,
    fetched_task_names character varying[],
    timeout_task_names character varying[],
    timeout_task_seconds double precision[]
) RETURNS TABLE (
    id bigint,
    status text,
    task_name character varying,
    priority integer,
    lock text,
    queueing_lock text,
    args jsonb,
    scheduled_at timestamp with time zone,
    queue_name character varying,
    attempts integer,
    worker_id bigint
)
LANGUAGE plpgsql
"""
    + SETTINGS
    + """
AS $pgstage_fetch$
#variable_conflict use_column
BEGIN
RETURN QUERY
WITH RECURSIVE waiting AS (
    (SELECT task_name, queue_name, priority, id
       FROM procrastinate_jobs
      WHERE status = 'todo'
      ORDER BY task_name, queue_name, priority DESC, id
      LIMIT 1)
    UNION ALL
    SELECT next.task_name, next.queue_name, next.priority, next.id
      FROM waiting
     CROSS JOIN LATERAL (
        SELECT task_name, queue_name, priority, id
          FROM procrastinate_jobs
         WHERE status = 'todo'
           AND (task_name, queue_name) > (waiting.task_name, waiting.queue_name)
         ORDER BY task_name, queue_name, priority DESC, id
         LIMIT 1) AS next
), mine AS (
    SELECT task_name, queue_name, priority, id
      FROM waiting
     WHERE task_name = ANY( $3::varchar[] )
       AND ($1::varchar[] IS NULL OR queue_name = ANY( $1::varchar[] ))
), tops AS (
    SELECT mine.task_name, mine.queue_name, top.priority, top.id, top.lock
      FROM mine
     CROSS JOIN LATERAL (
        SELECT ready.id, ready.priority, ready.lock
          FROM ((
        SELECT jobs.id, jobs.priority, jobs.lock
            FROM procrastinate_jobs AS jobs
            WHERE jobs.id = mine.id AND
                CASE WHEN jobs.lock IS NULL THEN true ELSE
                NOT EXISTS (
                    SELECT 1
                        FROM procrastinate_jobs AS other_jobs
                        WHERE
                            jobs.lock IS NOT NULL
                            AND other_jobs.lock = jobs.lock
                            AND (
                                other_jobs.status = 'doing'
                                OR
                                (
                                    other_jobs.status = 'todo'
                                    AND (
                                        other_jobs.priority > jobs.priority
                                        OR (
                                        other_jobs.priority = jobs.priority
                                        AND other_jobs.id < jobs.id
                                        )
                                    )
                                )
                            )
                ) END
                AND jobs.status = 'todo'
                AND (jobs.scheduled_at IS NULL OR jobs.scheduled_at <= now())
                AND jobs.task_name = mine.task_name
                AND jobs.queue_name = mine.queue_name
            ORDER BY jobs.priority DESC, jobs.id ASC LIMIT 1
        ) UNION ALL (
        SELECT jobs.id, jobs.priority, jobs.lock
            FROM procrastinate_jobs AS jobs
            WHERE
                CASE WHEN jobs.lock IS NULL THEN true ELSE
                NOT EXISTS (
                    SELECT 1
                        FROM procrastinate_jobs AS other_jobs
                        WHERE
                            jobs.lock IS NOT NULL
                            AND other_jobs.lock = jobs.lock
                            AND (
                                other_jobs.status = 'doing'
                                OR
                                (
                                    other_jobs.status = 'todo'
                                    AND (
                                        other_jobs.priority > jobs.priority
                                        OR (
                                        other_jobs.priority = jobs.priority
                                        AND other_jobs.id < jobs.id
                                        )
                                    )
                                )
                            )
                ) END
                AND jobs.status = 'todo'
                AND (jobs.scheduled_at IS NULL OR jobs.scheduled_at <= now())
                AND jobs.task_name = mine.task_name
                AND jobs.queue_name = mine.queue_name
            ORDER BY jobs.priority DESC, jobs.id ASC LIMIT 1
        )) AS ready
         LIMIT 1) AS top
), candidate AS (
    SELECT locked.*
      FROM (SELECT * FROM tops ORDER BY priority DESC, id ASC) AS top
     CROSS JOIN LATERAL (
        SELECT jobs.*
          FROM procrastinate_jobs AS jobs
         WHERE jobs.id = top.id
           -- Looked up by its primary key, whatever the statistics say: every other
           -- condition is written so that no index can serve it (the status as text: no
           -- partial index of the waiting jobs; IS NOT DISTINCT FROM: no index of the
           -- queue or the task). Statistics of an empty or vacuumed-quiet table made
           -- such an index, filtered by id, the cheaper-looking path: every waiting job
           -- read to lock one (tests/queueing/test_fetch_generic.py).
           AND jobs.status::text = 'todo'
           -- Taken as it was read: a job run and retried meanwhile (another queue, a
           -- later schedule, another priority or lock) is left to a later fetch, as
           -- procrastinate's fetch leaves it (its row lock re-checks its whole WHERE).
           AND jobs.task_name IS NOT DISTINCT FROM top.task_name
           AND jobs.queue_name IS NOT DISTINCT FROM top.queue_name
           AND jobs.priority IS NOT DISTINCT FROM top.priority
           AND jobs.lock IS NOT DISTINCT FROM top.lock
           AND (jobs.scheduled_at IS NULL OR jobs.scheduled_at <= now())
           FOR UPDATE OF jobs SKIP LOCKED) AS locked
     ORDER BY top.priority DESC, top.id ASC
     LIMIT 1
), contended AS (
    SELECT next.*
      FROM mine
     CROSS JOIN LATERAL (
        SELECT jobs.*
            FROM procrastinate_jobs AS jobs
            WHERE
                CASE WHEN jobs.lock IS NULL THEN true ELSE
                NOT EXISTS (
                    SELECT 1
                        FROM procrastinate_jobs AS other_jobs
                        WHERE
                            jobs.lock IS NOT NULL
                            AND other_jobs.lock = jobs.lock
                            AND (
                                other_jobs.status = 'doing'
                                OR
                                (
                                    other_jobs.status = 'todo'
                                    AND (
                                        other_jobs.priority > jobs.priority
                                        OR (
                                        other_jobs.priority = jobs.priority
                                        AND other_jobs.id < jobs.id
                                        )
                                    )
                                )
                            )
                ) END
                AND jobs.status = 'todo'
                AND (jobs.scheduled_at IS NULL OR jobs.scheduled_at <= now())
                AND jobs.task_name = mine.task_name
                AND jobs.queue_name = mine.queue_name
            ORDER BY jobs.priority DESC, jobs.id ASC LIMIT 1
            FOR UPDATE OF jobs SKIP LOCKED) AS next
     WHERE NOT EXISTS (SELECT 1 FROM candidate) AND EXISTS (SELECT 1 FROM tops)
     ORDER BY next.priority DESC, next.id ASC LIMIT 1
), fetched AS (
UPDATE procrastinate_jobs
    SET status = 'doing', worker_id = $2
    -- At most one id (contended only runs when candidate found none), as a scalar: the
    -- row is updated through its primary key, never joined to the table.
    WHERE procrastinate_jobs.id = (SELECT id FROM candidate UNION ALL SELECT id FROM contended
                                   LIMIT 1)
    RETURNING procrastinate_jobs.*
), deadline AS (
INSERT INTO pgstage_job_deadlines AS d
       (job_id, attempts, deadline, run_deadline, worker_id, owned_run_deadline)
SELECT fetched.id, fetched.attempts, now() + bound.seconds * interval '1 second',
       now() + bound.seconds * interval '1 second', $2,
       now() + bound.seconds * interval '1 second'
  FROM fetched
  JOIN unnest($4::varchar[], $5::float8[])
       AS bound (task_name, seconds) ON bound.task_name = fetched.task_name
ON CONFLICT (job_id) DO UPDATE
   SET deadline = CASE WHEN d.attempts = EXCLUDED.attempts
                            AND (d.polled OR d.worker_id IS NULL
                                 OR d.owned_run_deadline IS DISTINCT FROM d.run_deadline)
                       THEN d.deadline
                       ELSE EXCLUDED.deadline END,
       run_deadline = EXCLUDED.run_deadline,
       attempts = EXCLUDED.attempts,
       worker_id = EXCLUDED.worker_id,
       polled = false,
       owned_run_deadline = EXCLUDED.run_deadline
)
SELECT id::bigint, status::text, task_name::varchar, priority::integer,
       lock::text, queueing_lock::text, args::jsonb, scheduled_at::timestamptz,
       queue_name::varchar, attempts::integer, worker_id::bigint
  FROM (SELECT) AS one LEFT JOIN fetched ON true;
END;
$pgstage_fetch$;
"""
)


class Migration(migrations.Migration):
    dependencies = [("queueing", "0014_exclusive_key_predicate")]

    operations = [
        migrations.RunSQL(
            sql=FETCH,
            reverse_sql=(
                "DROP FUNCTION IF EXISTS pgstage_fetch_job_v1("
                "character varying[], bigint, character varying[], character varying[], "
                "double precision[]);"
            ),
        ),
    ]
