"""Rebase the credit ledger's transaction ids after a restore into another cluster."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from queueing.display import format_table
from runs.credits import credit_marks_rebase


class Command(BaseCommand):
    help = (
        "After restoring a dump into another cluster (pg_restore, or an upgrade that gives "
        "the cluster a new identifier): drop every balance mark and give every credit "
        "ledger entry the transaction id every mark folds, so that admissions read one "
        "mark and the entries since again, not each user's whole history. Locks the "
        "ledger while it runs (admissions wait); safe to run again."
    )

    def handle(self, *args, **options):
        rebased = credit_marks_rebase()
        self.stdout.write(
            format_table(["entries rebased", "marks dropped"], [[rebased.entries, rebased.marks]])
        )
        self.stdout.write("each user's next admission sums their ledger once and folds a new mark")
