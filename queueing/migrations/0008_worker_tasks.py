"""The task names each worker has: a worker fetches only jobs of its own tasks, so a job
whose task no live worker has waits, and the admin, ``/metrics`` and the workers' logs
say so (``queueing.jobs.unrunnable_tasks``). A worker's row goes with its worker's."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0007_metrics_snapshot")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE TABLE IF NOT EXISTS pgstage_worker_tasks ("
                " worker_id bigint PRIMARY KEY"
                "  REFERENCES procrastinate_workers (id) ON DELETE CASCADE,"
                " task_names text[] NOT NULL);"
            ),
            reverse_sql="DROP TABLE IF EXISTS pgstage_worker_tasks;",
        ),
    ]
