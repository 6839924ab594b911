"""The history's metric counts, taken once a minute by the metrics_snapshot sweep and
read by every /metrics scrape (one row)."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    initial = True
    dependencies = []

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
    ]
