"""The job that holds a stage's claim: a holder whose job stalled recovery took back
loses its lease at once (queueing.ledger)."""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("pipeline", "0005_pipeline_runs_running_idx")]

    operations = [
        migrations.AddField(
            model_name="pipelinerun",
            name="holder_job_id",
            field=models.BigIntegerField(blank=True, null=True),
        ),
    ]
