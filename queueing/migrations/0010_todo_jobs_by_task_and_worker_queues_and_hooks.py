"""The waiting jobs by task and queue, and each worker's queues and give-up hooks.

A worker fetches only jobs of its own tasks and queues; ``unrunnable_tasks`` (every
``/metrics`` scrape, every worker once a period) tells which waiting jobs no live worker
takes. Both read this partial index one (task, queue) at a time, so their cost does not
grow with the jobs waiting for other tasks or queues. Built without blocking writes (a
table of many waiting jobs keeps taking new ones meanwhile); a build that failed part-way
(a deadlock, a statement or lock timeout, a cancelled deploy) leaves an invalid index of
its name, which the planner never uses: the next run drops it first, so ``IF NOT EXISTS``
never keeps it. A worker's queues are NULL
when it listens to all, as procrastinate's ``queues`` argument. Its hooks (the task names
it has a give-up hook of) tell a worker that knows a task without its hook to leave an owed
hook to one that has it (``queueing.giveup``)."""

from __future__ import annotations

from django.db import migrations

from queueing.indexes import drop_invalid_index

INDEX = "pgstage_jobs_todo_by_task_idx"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("queueing", "0009_job_deadlines")]

    operations = [
        drop_invalid_index(INDEX),
        migrations.RunSQL(
            sql=(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS pgstage_jobs_todo_by_task_idx"
                " ON procrastinate_jobs (task_name, queue_name, priority DESC, id)"
                " WHERE status = 'todo';"
            ),
            reverse_sql="DROP INDEX CONCURRENTLY IF EXISTS pgstage_jobs_todo_by_task_idx;",
        ),
        migrations.RunSQL(
            sql="ALTER TABLE pgstage_worker_tasks ADD COLUMN IF NOT EXISTS queues text[];",
            reverse_sql="ALTER TABLE pgstage_worker_tasks DROP COLUMN IF EXISTS queues;",
        ),
        migrations.RunSQL(
            sql="ALTER TABLE pgstage_worker_tasks ADD COLUMN IF NOT EXISTS hooks text[];",
            reverse_sql="ALTER TABLE pgstage_worker_tasks DROP COLUMN IF EXISTS hooks;",
        ),
    ]
