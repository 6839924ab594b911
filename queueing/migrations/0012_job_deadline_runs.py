"""Whose run a deadline is (``queueing.timeouts``), and whether it is kept for polls.

A run's deadline row was matched to the job by attempt alone. A worker of the release
before job timeouts (during a rolling deploy) puts a dead worker's job back to 'todo'
without deleting its run's row, and its fetch records none; so the next run, at the same
attempt, was judged by the dead run's deadline: recovery ended it as hung, and a later
fetch by this release kept that deadline as the bound of its polls. ``worker_id`` is the
worker whose fetch wrote the row (moved with its jobs when it registers again):
recovery and the heartbeat's count of hung runs judge only that worker's run. ``polled``
is set by a poll (``PollLater``): only a row it released keeps its deadline when the same
attempt is fetched again. A row without ``worker_id`` was written by the previous release
and is judged as it was."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0011_job_run_deadlines")]

    operations = [
        migrations.RunSQL(
            sql=(
                "ALTER TABLE pgstage_job_deadlines ADD COLUMN IF NOT EXISTS worker_id bigint,"
                " ADD COLUMN IF NOT EXISTS polled boolean NOT NULL DEFAULT false;"
            ),
            reverse_sql=(
                "ALTER TABLE pgstage_job_deadlines DROP COLUMN IF EXISTS worker_id,"
                " DROP COLUMN IF EXISTS polled;"
            ),
        ),
    ]
