"""The retention sweep reads the oldest finished jobs in id order: a partial index over
exactly those, so its batch costs the same however many live jobs the table holds."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0002_job_stalls_and_retry_guard")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE INDEX IF NOT EXISTS pgstage_jobs_finished_idx ON procrastinate_jobs (id) "
                "WHERE status IN ('succeeded', 'cancelled', 'aborted');"
            ),
            reverse_sql="DROP INDEX IF EXISTS pgstage_jobs_finished_idx;",
        ),
    ]
