"""When each inline sweep (stalled recovery) last ran, and when it last resumed after a
gap: a worker's silence during a gap (the database or every worker away) is no sign of
its death, so recovery counts silence from the resumption."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0003_finished_jobs_index")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE TABLE IF NOT EXISTS pgstage_inline_sweeps ("
                " name text PRIMARY KEY,"
                " last_run timestamptz NOT NULL,"
                " resumed_at timestamptz NOT NULL);"
            ),
            reverse_sql="DROP TABLE IF EXISTS pgstage_inline_sweeps;",
        ),
    ]
