"""Indexes built without blocking writes, for migrations (``atomic = False``).

``CREATE INDEX CONCURRENTLY`` that fails part-way (a deadlock, a statement or lock
timeout, a cancelled deploy) leaves an invalid index of its name, which the planner never
uses and ``IF NOT EXISTS`` would keep for ever. :func:`drop_invalid_index` makes a
``RunPython`` that drops such a leftover first, so that the next run builds it again::

    operations = [
        drop_invalid_index("my_idx"),
        migrations.RunSQL("CREATE INDEX CONCURRENTLY IF NOT EXISTS my_idx ON ...",
                          "DROP INDEX CONCURRENTLY IF EXISTS my_idx"),
    ]

:func:`drop_index` drops an index without blocking writes (a foreign key's index that
another index covers, say), and builds it again, concurrently, when reversed.
"""

from __future__ import annotations

from django.apps.registry import Apps
from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.utils import CursorWrapper

__all__ = ["drop_index", "drop_invalid_index", "is_invalid"]


def is_invalid(cursor: CursorWrapper, name: str) -> bool:
    """Whether index ``name`` of the current schema exists and is invalid."""
    cursor.execute(
        "SELECT NOT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE c.relname = %s AND c.relnamespace = current_schema()::regnamespace",
        [name],
    )
    row = cursor.fetchone()
    return row is not None and row[0]


def drop_invalid_index(name: str) -> migrations.RunPython:
    """A migration operation that drops index ``name`` when a failed build left it
    invalid (a valid one, or none, is left as it is); reversed, it does nothing."""

    def drop(apps: Apps, schema_editor: BaseDatabaseSchemaEditor) -> None:
        with schema_editor.connection.cursor() as cursor:
            if is_invalid(cursor, name):
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")

    return migrations.RunPython(drop, migrations.RunPython.noop)


def drop_index(name: str, *, on: str) -> migrations.RunSQL:
    """A migration operation that drops index ``name`` (``CONCURRENTLY``, if it exists);
    reversed, it builds the index again ``on`` a table and its columns, e.g.
    ``"credit_ledger (job_id)"``. For a non-atomic migration."""
    return migrations.RunSQL(
        f"DROP INDEX CONCURRENTLY IF EXISTS {name}",
        f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON {on}",
    )
