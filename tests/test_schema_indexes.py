"""Every index of the project's own tables earns its upkeep: none is a leading prefix of
another btree index of the same table, same columns and operator classes, both over all
rows (a foreign key's index that a unique constraint leading with the key covers, say).
Each such index costs every insert a write and buys no lookup the other does not
serve."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db

#: The apps whose tables are the project's (Django's and procrastinate's are not).
OWN_APPS = ("accounts", "pipeline", "queueing", "runs")

REDUNDANT = """
SELECT c.relname, ia.relname, ib.relname
  FROM pg_index a
  JOIN pg_index b ON b.indrelid = a.indrelid AND b.indexrelid <> a.indexrelid
  JOIN pg_class c ON c.oid = a.indrelid
  JOIN pg_class ia ON ia.oid = a.indexrelid
  JOIN pg_class ib ON ib.oid = b.indexrelid
 WHERE c.relname = ANY(%s)
   AND NOT a.indisunique
   AND a.indpred IS NULL AND b.indpred IS NULL
   AND a.indexprs IS NULL AND b.indexprs IS NULL
   AND ia.relam = ib.relam
   AND a.indnkeyatts <= b.indnkeyatts
   AND (a.indkey::int2[])[0:a.indnkeyatts - 1] = (b.indkey::int2[])[0:a.indnkeyatts - 1]
   AND (a.indclass::oid[])[0:a.indnkeyatts - 1] = (b.indclass::oid[])[0:a.indnkeyatts - 1]
 ORDER BY 1, 2
"""


def own_tables() -> list[str]:
    return [
        model._meta.db_table
        for name in OWN_APPS
        for model in apps.get_app_config(name).get_models()
        if model._meta.managed
    ]


def test_no_index_of_the_projects_tables_is_covered_by_another():
    tables = own_tables()
    assert "credit_ledger" in tables and "pipeline_runs" in tables
    with connection.cursor() as cursor:
        cursor.execute(REDUNDANT, [tables])
        redundant = cursor.fetchall()
    assert redundant == [], "\n".join(
        f"{table}: {index} is covered by {by} (give its field db_index=False)"
        for table, index, by in redundant
    )


def test_the_check_finds_a_covered_index():
    with connection.cursor() as cursor:
        cursor.execute("CREATE INDEX test_covered_idx ON credit_ledger (user_id)")
        try:
            cursor.execute(REDUNDANT, [["credit_ledger"]])
            found = cursor.fetchall()
        finally:
            cursor.execute("DROP INDEX test_covered_idx")
    assert ("credit_ledger", "test_covered_idx", "credit_ledger_user_idx") in found
