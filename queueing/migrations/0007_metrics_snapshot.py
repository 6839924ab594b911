"""The history's metric counts, taken once a minute by the metrics_snapshot sweep and read
by every /metrics scrape (one row); and the permission that lets a user read /metrics.

The table used to be created by the reference site's own migration (``site.0001``), with
the same statement: ``IF NOT EXISTS`` keeps a database that already has it as it is, rows
included, and creates it in a new project."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0006_owed_give_ups")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE TABLE IF NOT EXISTS pgstage_metrics_snapshot ("
                " id smallint PRIMARY KEY CHECK (id = 1),"
                " taken_at timestamptz NOT NULL,"
                " payload jsonb NOT NULL);"
            ),
            reverse_sql="DROP TABLE IF EXISTS pgstage_metrics_snapshot;",
        ),
        migrations.AlterModelOptions(
            name="sweeppermissions",
            options={
                "managed": False,
                "default_permissions": (),
                "permissions": [
                    ("run_sweeps", "Can run, dry-run and queue sweeps from the admin"),
                    ("view_metrics", "Can read /metrics"),
                ],
            },
        ),
    ]
