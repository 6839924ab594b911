"""A user's balance as a mark plus the ledger entries since (``runs.models.CreditBalanceMark``).

Each ledger entry records the transaction that inserted it, ``created_xid`` (a column only
SQL knows, the ORM never writes it): ``pg_current_xact_id()`` for every entry from now on,
and ``1`` for those already there, which every mark folds, since their transactions have
all ended. Neither step rewrites the table: a constant default is kept in the catalogue
for the existing rows, and the new default applies to rows inserted afterwards; the
ledger's lock is held only for the two catalogue changes. No mark is made here: a user's
first admission sums their ledger once and folds it."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models

import runs.models

ADD_XID = """
ALTER TABLE credit_ledger ADD COLUMN created_xid xid8 NOT NULL DEFAULT '1'::xid8;
ALTER TABLE credit_ledger ALTER COLUMN created_xid SET DEFAULT pg_current_xact_id();
"""
DROP_XID = "ALTER TABLE credit_ledger DROP COLUMN created_xid;"


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0009_drop_credit_balances"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunSQL(ADD_XID, DROP_XID),
        migrations.CreateModel(
            name="CreditBalanceMark",
            fields=[
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="credit_balance_mark",
                        serialize=False,
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                ("balance", models.BigIntegerField()),
                ("horizon", runs.models.Xid8Field()),
                ("cluster", models.BigIntegerField()),
                (
                    "entries",
                    models.BigIntegerField(help_text="how many ledger entries the balance folds"),
                ),
                ("folded_at", models.DateTimeField()),
            ],
            options={"db_table": "credit_balance_marks"},
        ),
    ]
