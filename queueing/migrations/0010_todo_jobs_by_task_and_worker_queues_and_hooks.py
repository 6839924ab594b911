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

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

INDEX = "pgstage_jobs_todo_by_task_idx"


def drop_invalid_index(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
            [INDEX],
        )
        row = cursor.fetchone()
        if row is not None and row[0]:
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("queueing", "0009_job_deadlines")]

    operations = [
        migrations.RunPython(drop_invalid_index, migrations.RunPython.noop),
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
