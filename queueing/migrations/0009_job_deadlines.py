"""Job timeouts (``queueing.timeouts``): each run's deadline, recorded by the fetch on the
database's clock, per job and attempt; and per worker, its slots and how many of them
hung runs hold (written by its heartbeat). A job's deadline goes with its job, a worker's
counts with its worker."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0008_worker_tasks")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE TABLE IF NOT EXISTS pgstage_job_deadlines ("
                " job_id bigint PRIMARY KEY"
                "  REFERENCES procrastinate_jobs (id) ON DELETE CASCADE,"
                " attempts integer NOT NULL,"
                " deadline timestamptz NOT NULL);"
                "ALTER TABLE pgstage_worker_tasks"
                " ADD COLUMN IF NOT EXISTS slots integer,"
                " ADD COLUMN IF NOT EXISTS hung_slots integer NOT NULL DEFAULT 0;"
            ),
            reverse_sql=(
                "ALTER TABLE pgstage_worker_tasks DROP COLUMN IF EXISTS slots,"
                " DROP COLUMN IF EXISTS hung_slots;"
                "DROP TABLE IF EXISTS pgstage_job_deadlines;"
            ),
        ),
    ]
