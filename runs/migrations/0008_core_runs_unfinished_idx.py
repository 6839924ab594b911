"""The unfinished core runs (held, released, judging) by id: the resume tick's held-run
expiry reads them, never every run ever made. Built without blocking the table's writes
(``CONCURRENTLY``); a build that failed part-way (a deadlock, a statement or lock timeout,
a cancelled deploy) leaves an invalid index of its name, which the next run drops first
(as ``queueing.0010``), so that it builds the index again instead of failing on the name."""

from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

from queueing.indexes import drop_invalid_index

INDEX = "core_runs_unfinished_idx"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("runs", "0007_core_run_cancelled"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        drop_invalid_index(INDEX),
        AddIndexConcurrently(
            model_name="corerun",
            index=models.Index(
                condition=models.Q(("state__in", ["held", "released", "judging"])),
                fields=["id"],
                name=INDEX,
            ),
        ),
    ]
