"""The core's daily budget is counted per tenant.

``core_daily_usage`` is rebuilt keyed by (tenant, day): every core run that exists was
counted when it was created (a refused admission leaves neither), so the usage per
tenant and day is recounted from ``core_runs`` and today's budgets start where they
stand.
"""

import django.db.models.deletion
from django.db import migrations, models

RECOUNT = """
INSERT INTO core_daily_usage (tenant_id, day, used)
SELECT u.tenant_id, (c.created_at AT TIME ZONE 'UTC')::date, count(*)
  FROM core_runs c
  JOIN users u ON u.id = c.user_id
 WHERE u.tenant_id IS NOT NULL
 GROUP BY 1, 2;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0001_initial"),
        ("runs", "0004_credit_amounts_64bit"),
    ]

    operations = [
        migrations.DeleteModel(name="CoreDailyUsage"),
        migrations.CreateModel(
            name="CoreDailyUsage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("day", models.DateField()),
                ("used", models.PositiveIntegerField(default=0)),
                (
                    "tenant",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="+",
                        to="accounts.tenant",
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "core daily usage",
                "db_table": "core_daily_usage",
                "ordering": ["-day", "tenant_id"],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("tenant", "day"), name="core_daily_usage_tenant_day_uq"
                    )
                ],
            },
        ),
        migrations.RunSQL(RECOUNT, migrations.RunSQL.noop),
    ]
