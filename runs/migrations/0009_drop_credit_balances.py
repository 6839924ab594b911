"""Remove what a development build's migration ``0009_credit_balances`` created, where it
ran: a ``credit_balances`` table kept by triggers on ``credit_ledger``. That design was
backed out before any release (its row locks joined the admission's lock order); a
database that applied it keeps the triggers, which would lock a balance row on every
ledger write, in the old order's reverse. Idempotent: on every other database it does
nothing."""

from django.db import migrations

DROP = """
DROP TRIGGER IF EXISTS credit_balances_empty ON credit_ledger;
DROP TRIGGER IF EXISTS credit_balances_follow ON credit_ledger;
DROP FUNCTION IF EXISTS credit_balances_empty();
DROP FUNCTION IF EXISTS credit_balances_follow();
DROP TABLE IF EXISTS credit_balances;
"""


class Migration(migrations.Migration):
    dependencies = [("runs", "0008_core_runs_unfinished_idx")]

    operations = [migrations.RunSQL(DROP, migrations.RunSQL.noop)]
