"""The EXCLUSIVE singleton policy: one job per key across waiting, retrying and running.

procrastinate's own ``queueing_lock`` index covers ``todo`` only. This partial unique index
covers ``todo`` and ``doing`` for queueing locks that ``queueing.enqueue`` marks exclusive.
"""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("procrastinate", "0041_post_retry_failed_job")]

    operations = [
        migrations.RunSQL(
            sql=(
                "CREATE UNIQUE INDEX IF NOT EXISTS pgstage_jobs_exclusive_key "
                "ON procrastinate_jobs (queueing_lock) "
                "WHERE status IN ('todo', 'doing') AND queueing_lock LIKE 'exclusive/%%';"
            ),
            reverse_sql="DROP INDEX IF EXISTS pgstage_jobs_exclusive_key;",
        ),
    ]
