"""Each run's own deadline, apart from the bound of its polls (``queueing.timeouts``).

A job that waits on a busy holder (``PollLater``) is fetched again at the same attempt and
keeps its first fetch's deadline: its polls spend no attempts until then. That deadline
was also the bound recovery judged the run by, so a run fetched again after it (the job
waited behind a backlog) was ended as hung as soon as it started, and its retry ran beside
it. ``run_deadline`` is set afresh by every fetch; recovery and the heartbeat's count of
hung runs judge a run by the later of the two (a row written by a worker of the previous
release has none: its deadline is the run's)."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0010_todo_jobs_by_task_and_worker_queues_and_hooks")]

    operations = [
        migrations.RunSQL(
            sql="ALTER TABLE pgstage_job_deadlines ADD COLUMN IF NOT EXISTS run_deadline timestamptz;",
            reverse_sql="ALTER TABLE pgstage_job_deadlines DROP COLUMN IF EXISTS run_deadline;",
        ),
    ]
