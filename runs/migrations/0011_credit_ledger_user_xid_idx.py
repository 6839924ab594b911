"""A user's ledger entries by inserting transaction: the balance reads the entries from
its mark's horizon on (``runs.0010``) in one index range, however long the history.
Built without blocking the ledger's writes (``CONCURRENTLY``); a build that failed
part-way leaves an invalid index of its name, which the next run drops first (as
``runs.0008``)."""

from django.db import migrations

from queueing.indexes import drop_invalid_index

INDEX = "credit_ledger_user_xid_idx"


class Migration(migrations.Migration):
    atomic = False
    dependencies = [("runs", "0010_credit_balance_marks")]

    operations = [
        drop_invalid_index(INDEX),
        migrations.RunSQL(
            f"CREATE INDEX CONCURRENTLY IF NOT EXISTS {INDEX} "
            "ON credit_ledger (user_id, created_xid)",
            f"DROP INDEX CONCURRENTLY IF EXISTS {INDEX}",
        ),
    ]
