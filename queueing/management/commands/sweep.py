"""Run sweeps once, in this process. Safe from cron and beside running workers: each
sweep takes its rows FOR UPDATE SKIP LOCKED and re-checks state in every write, and an
inline sweep (stalled recovery) runs under the same try-lock and clock as the workers'
own runs (``queueing.sweeps.watch``): skipped while a worker's run holds the lock, and
after a gap it takes no job whose worker may not have beaten again yet."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from queueing.display import format_table, progress
from queueing.exceptions import UnknownSweep
from queueing.sweeps import get_sweep, run_sweep, sweeps

#: A batch is one SQL LIMIT: beyond this it is a typo, not a batch (and past 2**63 an
#: error of the database's).
MAX_BATCH_SIZE = 1_000_000


class Command(BaseCommand):
    help = "Run one sweep (or --all) once and print what it selected and changed."

    def add_arguments(self, parser):
        parser.add_argument("name", nargs="?", help="sweep name (see --list)")
        parser.add_argument(
            "--all", dest="run_all", action="store_true", help="run every declared sweep"
        )
        parser.add_argument(
            "--list", dest="list_only", action="store_true", help="list sweeps and exit"
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="only count what would be selected"
        )
        parser.add_argument("--batch-size", type=int, default=None)

    def handle(
        self,
        *args,
        name=None,
        run_all=False,
        list_only=False,
        dry_run=False,
        batch_size=None,
        **options,
    ):
        declared = sweeps()
        if list_only:
            self._table(
                ["sweep", "when", "batch", "grace s", "what it does"],
                [
                    [s.name, s.schedule, s.batch_size, s.grace_seconds, s.description]
                    for s in declared.values()
                ],
            )
            return
        if bool(name) == run_all:
            raise CommandError(
                "name one sweep or pass --all; declared sweeps: " + ", ".join(declared)
            )
        if batch_size is not None and not 1 <= batch_size <= MAX_BATCH_SIZE:
            raise CommandError(f"--batch-size must be at least 1 and at most {MAX_BATCH_SIZE}.")
        names = list(declared) if run_all else [name]
        rows: list[list[object]] = []
        shown = progress(names, label="sweeps", stream=self.stderr) if len(names) > 1 else names
        for sweep_name in shown:
            try:
                get_sweep(sweep_name)
            except UnknownSweep as exc:
                raise CommandError(f"{exc}. Run 'manage.py sweep --list'.") from exc
            result = run_sweep(sweep_name, dry_run=dry_run, batch_size=batch_size)
            if result is None:
                rows.append([sweep_name, "-", "-", "-", "skipped: another run holds its lock"])
                continue
            notes = ", ".join(f"{k}={v}" for k, v in sorted(result.notes.items()))
            rows.append(
                [
                    sweep_name,
                    result.selected,
                    "-" if dry_run else result.changed,
                    result.failed,
                    notes,
                ]
            )
        self._table(["sweep", "selected", "changed", "failed", "notes"], rows)
        if dry_run:
            self.stdout.write("dry run: nothing was written")

    def _table(self, header, rows):
        self.stdout.write(format_table(header, rows))
