"""The unfinished core runs (held, released, judging) by id: the resume tick's held-run
expiry reads them, never every run ever made."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0007_core_run_cancelled"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name="corerun",
            index=models.Index(
                condition=models.Q(("state__in", ["held", "released", "judging"])),
                fields=["id"],
                name="core_runs_unfinished_idx",
            ),
        ),
    ]
