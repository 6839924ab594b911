"""The unfinished core runs (held, released, judging) by id: the resume tick's held-run
expiry reads them, never every run ever made. Built without blocking the table's writes
(``CONCURRENTLY``)."""

from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False
    dependencies = [
        ("runs", "0007_core_run_cancelled"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="corerun",
            index=models.Index(
                condition=models.Q(("state__in", ["held", "released", "judging"])),
                fields=["id"],
                name="core_runs_unfinished_idx",
            ),
        ),
    ]
