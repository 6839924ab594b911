"""Exit 0 when every worker started on this host heart-beats, else 1: the worker's
health check for a container (``HEALTHCHECK``, compose ``healthcheck``) or a systemd
watchdog script. Read-only; safe to run every few seconds."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from queueing import worker_state
from queueing.display import format_table
from queueing.health import local_worker_health, stall_threshold


class Command(BaseCommand):
    help = (
        "Check that the procrastinate workers running on this host heart-beat within "
        "STALLED_WORKER_SECONDS; exit status 1 when one does not (or none runs)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--max-age",
            type=float,
            default=None,
            help="seconds a heartbeat may be old (default: STALLED_WORKER_SECONDS)",
        )

    def handle(self, *args, max_age: float | None = None, **options):
        threshold = stall_threshold()
        if max_age is not None:
            if max_age <= 0:
                raise CommandError("--max-age must be a positive number of seconds.")
            threshold = type(threshold)(seconds=max_age)
        try:
            beats = local_worker_health()
        except DatabaseError as exc:
            raise CommandError(f"the database does not answer: {exc}".strip()) from exc
        if not beats:
            raise CommandError(
                f"no worker runs on this host (nothing recorded under "
                f"{worker_state.state_dir()}); start one with manage.py procrastinate worker"
            )
        self.stdout.write(
            format_table(
                ["pid", "worker id", "last heartbeat", "healthy"],
                [
                    [
                        b.pid,
                        b.worker_id,
                        f"{b.age.total_seconds():.0f} s ago" if b.age is not None else "none",
                        "yes" if b.healthy(threshold) else "no",
                    ]
                    for b in beats
                ],
            )
        )
        stale = [b for b in beats if not b.healthy(threshold)]
        if stale:
            raise CommandError(
                f"{len(stale)} of {len(beats)} local worker(s) did not heart-beat within "
                f"{threshold.total_seconds():.0f} s"
            )
