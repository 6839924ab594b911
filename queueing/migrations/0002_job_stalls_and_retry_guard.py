"""Stall counts apart from procrastinate's attempts, and a clear refusal for a retry that
would collide with a live job's singleton key.

``pgstage_job_stalls`` counts how often a job's worker died under it (stalled recovery's
budget); procrastinate's ``attempts`` keeps counting the task's own failures and retries.

The trigger turns the bare unique violation that procrastinate's own retry (its admin
action, ``procrastinate_retry_job_v2``) hits when a fresh job holds the key into a message
that names that job and says what to do instead.
"""

from __future__ import annotations

from django.db import migrations

STALLS = """
CREATE TABLE IF NOT EXISTS pgstage_job_stalls (
    job_id bigint PRIMARY KEY REFERENCES procrastinate_jobs (id) ON DELETE CASCADE,
    stalls integer NOT NULL,
    last_stalled_at timestamptz NOT NULL,
    last_worker_id bigint
);
"""

GUARD = """
CREATE OR REPLACE FUNCTION pgstage_refuse_colliding_retry() RETURNS trigger
    LANGUAGE plpgsql AS $$
DECLARE
    holder bigint;
BEGIN
    SELECT id INTO holder
      FROM procrastinate_jobs
     WHERE queueing_lock = NEW.queueing_lock
       AND id <> NEW.id
       AND (status = 'todo'
            OR (status = 'doing' AND NEW.queueing_lock LIKE 'exclusive/%%'))
     LIMIT 1;
    IF holder IS NOT NULL THEN
        RAISE EXCEPTION 'job % cannot go back to todo: job % holds its singleton key %',
                        NEW.id, holder, NEW.queueing_lock
              USING ERRCODE = 'unique_violation',
                    HINT = 'job ' || holder || ' does the same work. Retry through pgstage '
                           '(the job admin''s retry, queueing.jobs.job_retry), which '
                           'deduplicates onto it.';
    END IF;
    RETURN NEW;
END;
$$;

DROP TRIGGER IF EXISTS pgstage_refuse_colliding_retry ON procrastinate_jobs;
CREATE TRIGGER pgstage_refuse_colliding_retry
    BEFORE UPDATE OF status ON procrastinate_jobs
    FOR EACH ROW
    WHEN (NEW.status = 'todo' AND OLD.status <> 'todo' AND NEW.queueing_lock IS NOT NULL)
    EXECUTE FUNCTION pgstage_refuse_colliding_retry();
"""


class Migration(migrations.Migration):
    dependencies = [("queueing", "0001_exclusive_singleton_index")]

    operations = [
        migrations.RunSQL(sql=STALLS, reverse_sql="DROP TABLE IF EXISTS pgstage_job_stalls;"),
        migrations.RunSQL(
            sql=GUARD,
            reverse_sql=(
                "DROP TRIGGER IF EXISTS pgstage_refuse_colliding_retry ON procrastinate_jobs;"
                "DROP FUNCTION IF EXISTS pgstage_refuse_colliding_retry();"
            ),
        ),
    ]
