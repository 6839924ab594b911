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

    def add_arguments(self, parser):
        parser.add_argument(
            "--dry-run", action="store_true", help="count what it would change; change nothing"
        )

    def handle(self, *args, dry_run=False, **options):
        rebased = credit_marks_rebase(dry_run=dry_run)
        verb = "would be " if dry_run else ""
        self.stdout.write(
            format_table(
                [f"entries {verb}rebased", f"marks {verb}dropped"],
                [[rebased.entries, rebased.marks]],
            )
        )
        self.stdout.write(
            "dry run: nothing changed; run it without --dry-run to rebase"
            if dry_run
            else "each user's next admission sums their ledger once and folds a new mark"
        )
