"""Credit amounts become 64-bit."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runs", "0001_initial")]

    operations = [
        migrations.AlterField(
            model_name="creditentry",
            name="amount",
            field=models.BigIntegerField(),
        ),
    ]
