"""Tasks the throughput benchmark runs (loaded by workers via PGSTAGE_TASK_MODULES)."""

from __future__ import annotations

from django.db import connection, models, transaction
from procrastinate.contrib.django import app as procrastinate_app

from queueing.app import task
from queueing.keys import KeyFormat
from queueing.ledger import Ledger, LedgerEntry

BENCH_KEY = KeyFormat(prefix="bench", parts=("unit",))


class BenchStep(LedgerEntry):
    unit = models.CharField(max_length=50)
    stage = models.CharField(max_length=20)

    class Meta:
        app_label = "queueing"
        db_table = "bench_steps"
        constraints = [models.UniqueConstraint(fields=["unit", "stage"], name="bench_steps_uq")]

    def __str__(self) -> str:
        return f"{self.unit}/{self.stage}"


LEDGER = Ledger(model=BenchStep, key_fields=("unit", "stage"))


@procrastinate_app.task(name="bench.plain")
def plain(unit: str) -> None:
    """Plain procrastinate: the business write by hand, no idempotency."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO bench_plain (unit) VALUES (%s) ON CONFLICT DO NOTHING", [unit])


@task(name="bench.stage")
def stage(unit: str) -> None:
    """pgstage's stage path: ledger claim, then complete in a transaction."""
    claim = LEDGER.claim(unit=unit, stage="s")
    if not claim.claimed:
        return
    with transaction.atomic():
        LEDGER.complete(claim)
