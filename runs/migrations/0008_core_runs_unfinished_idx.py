"""The unfinished core runs (held, released, judging) by id: the resume tick's held-run
expiry reads them, never every run ever made. Built without blocking the table's writes
(``CONCURRENTLY``); a build that failed part-way (a deadlock, a statement or lock timeout,
a cancelled deploy) leaves an invalid index of its name, which the next run drops first
(as ``queueing.0010``), so that it builds the index again instead of failing on the name."""

from django.apps.registry import Apps
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor

INDEX = "core_runs_unfinished_idx"


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
    dependencies = [
        ("runs", "0007_core_run_cancelled"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(drop_invalid_index, migrations.RunPython.noop),
        AddIndexConcurrently(
            model_name="corerun",
            index=models.Index(
                condition=models.Q(("state__in", ["held", "released", "judging"])),
                fields=["id"],
                name=INDEX,
            ),
        ),
    ]
