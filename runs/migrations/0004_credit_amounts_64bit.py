"""Credit amounts become 64-bit."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_analysis_job_run_saved")]

    operations = [
        migrations.AlterField(
            model_name="creditentry",
            name="amount",
            field=models.BigIntegerField(),
        ),
    ]
