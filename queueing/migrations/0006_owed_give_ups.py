"""Give-up hooks still owed: a job saved ``failed`` for good owes its task's give-up hook,
recorded in the statement that saves the failure, and deleted in the transaction that runs
the hook. A worker that dies (or loses the reply to its commit) between the two leaves
the row for the next maintenance run of any worker: a hook is never lost."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0005_sweep_permissions")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE TABLE IF NOT EXISTS pgstage_owed_give_ups ("
                " job_id bigint PRIMARY KEY,"
                " task_name text NOT NULL,"
                " args jsonb NOT NULL,"
                " reason text NOT NULL,"
                " created_at timestamptz NOT NULL DEFAULT now());"
            ),
            reverse_sql="DROP TABLE IF EXISTS pgstage_owed_give_ups;",
        ),
    ]
