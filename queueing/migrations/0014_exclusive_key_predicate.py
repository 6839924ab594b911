"""The EXCLUSIVE key's partial unique index, with the predicate its queries state.

0001 created ``pgstage_jobs_exclusive_key`` from SQL run without parameters, so its
``LIKE 'exclusive/%%'`` stayed doubled. It matches the same keys (``%%`` is two
wildcards), so uniqueness was always enforced; but a query's ``LIKE 'exclusive/%'`` does
not prove that predicate, so the planner never probed the index (the resume tick's
``lost_process_jobs`` scanned every waiting job instead, or the whole table with stale
statistics). The index is built again with the single ``%``, without blocking the
table's writes (``CONCURRENTLY``, as ``0010``): the new one before the old is dropped, so
the key's uniqueness holds at every moment. A build that failed part-way leaves an invalid
index of the new name, which the next run drops first; a run that failed after the old
index was dropped renames the new one the next time.
"""

from __future__ import annotations

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

from queueing.indexes import is_invalid

INDEX = "pgstage_jobs_exclusive_key"
CREATE = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS {name} ON procrastinate_jobs "
    "(queueing_lock) WHERE status IN ('todo', 'doing') AND queueing_lock LIKE '{pattern}';"
)


def _rebuild(schema_editor: BaseDatabaseSchemaEditor, *, pattern: str) -> None:
    new = f"{INDEX}_new"
    with schema_editor.connection.cursor() as cursor:
        if is_invalid(cursor, new):
            cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {new}")
        # Sent without parameters: a % is a %.
        cursor.execute(CREATE.format(name=new, pattern=pattern))
        cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}")
        cursor.execute(f"ALTER INDEX {new} RENAME TO {INDEX}")


def forward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _rebuild(schema_editor, pattern="exclusive/%")


def backward(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    _rebuild(schema_editor, pattern="exclusive/%%")


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("queueing", "0013_job_deadline_owned_run")]

    operations = [migrations.RunPython(forward, backward)]
