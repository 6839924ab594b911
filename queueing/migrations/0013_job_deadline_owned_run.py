"""Whether the fetch that wrote a deadline row last was this release's (``queueing.timeouts``).

Migration 0012 gave each row the fetching worker's id and a ``polled`` flag. A worker of
the previous release, still running during a rolling deploy, fetches a job whose row this
release wrote (a poll released it, or its attempt failed and was retried): its statement
rewrites the deadlines and the attempt but leaves ``worker_id`` and ``polled`` as they
were, so its run was judged by another worker's id, or as a poll's, and a hung run of it
was never ended. ``owned_run_deadline`` is the ``run_deadline`` this release's fetch wrote
with them: every fetch writes a fresh ``run_deadline``, so when the two differ a fetch of
the previous release came last, and the row is judged as that release judged it."""

from __future__ import annotations

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("queueing", "0012_job_deadline_runs")]

    operations = [
        migrations.RunSQL(
            sql=(
                "ALTER TABLE pgstage_job_deadlines "
                "ADD COLUMN IF NOT EXISTS owned_run_deadline timestamptz;"
            ),
            reverse_sql=(
                "ALTER TABLE pgstage_job_deadlines DROP COLUMN IF EXISTS owned_run_deadline;"
            ),
        ),
    ]
