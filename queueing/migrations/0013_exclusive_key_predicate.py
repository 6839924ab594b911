"""The EXCLUSIVE key's partial unique index, with the predicate its queries state.

0001 created ``pgstage_jobs_exclusive_key`` from SQL run without parameters, so its
``LIKE 'exclusive/%%'`` stayed doubled. It matches the same keys (``%%`` is two
wildcards), so uniqueness was always enforced; but a query's ``LIKE 'exclusive/%'`` does
not prove that predicate, so the planner never probed the index (the resume tick's
``lost_process_jobs`` scanned every waiting job instead, or the whole table with stale
statistics). The index is built again with the single ``%``, the new one before the old
is dropped, in one transaction: no moment without the key's uniqueness.
"""

from __future__ import annotations

from django.db import migrations

CREATE = (
    "CREATE UNIQUE INDEX {name} ON procrastinate_jobs (queueing_lock) "
    "WHERE status IN ('todo', 'doing') AND queueing_lock LIKE '{pattern}';"
)

# RunSQL sends these without parameters: a % is a %.
FORWARD = "\n".join(
    [
        CREATE.format(name="pgstage_jobs_exclusive_key_new", pattern="exclusive/%"),
        "DROP INDEX IF EXISTS pgstage_jobs_exclusive_key;",
        "ALTER INDEX pgstage_jobs_exclusive_key_new RENAME TO pgstage_jobs_exclusive_key;",
    ]
)
BACKWARD = "\n".join(
    [
        CREATE.format(name="pgstage_jobs_exclusive_key_old", pattern="exclusive/%%"),
        "DROP INDEX IF EXISTS pgstage_jobs_exclusive_key;",
        "ALTER INDEX pgstage_jobs_exclusive_key_old RENAME TO pgstage_jobs_exclusive_key;",
    ]
)


class Migration(migrations.Migration):
    dependencies = [("queueing", "0012_job_deadline_runs")]

    operations = [migrations.RunSQL(sql=FORWARD, reverse_sql=BACKWARD)]
