"""Exit 0 when every worker started on this host heart-beats and has a slot not held by a
hung job (``queueing.timeouts``), else 1: the worker's
health check for a container (``HEALTHCHECK``, compose ``healthcheck``) or a systemd
watchdog script. Read-only; safe to run every few seconds."""

from __future__ import annotations

import argparse
import math
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from queueing import worker_state
from queueing.display import format_table
from queueing.health import local_worker_health, stall_threshold

#: The largest --max-age: a week (a heartbeat older than that is no heartbeat).
MAX_AGE_LIMIT_SECONDS = 7 * 24 * 3600


def max_age_seconds(value: object) -> float:
    """``--max-age``: a finite number of seconds, above 0 and at most a week."""
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or not 0 < seconds <= MAX_AGE_LIMIT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"{value!r}: give a positive number of seconds, at most {MAX_AGE_LIMIT_SECONDS}"
        )
    return seconds


class Command(BaseCommand):
    help = (
        "Check that the procrastinate workers running on this host heart-beat within "
        "STALLED_WORKER_SECONDS; exit status 1 when one does not (or none runs)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--max-age",
            type=max_age_seconds,
            default=None,
            help="seconds a heartbeat may be old (default: STALLED_WORKER_SECONDS)",
        )

    def handle(self, *args: Any, max_age: float | None = None, **options: Any) -> None:
        threshold = stall_threshold()
        if max_age is not None:
            # call_command() passes the value without the parser: check it here too.
            try:
                seconds = max_age_seconds(max_age)
            except argparse.ArgumentTypeError as exc:
                raise CommandError(f"--max-age {exc}") from None
            threshold = type(threshold)(seconds=seconds)
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
                ["pid", "worker id", "last heartbeat", "hung slots", "healthy"],
                [
                    [
                        b.pid,
                        b.worker_id,
                        f"{b.age.total_seconds():.0f} s ago" if b.age is not None else "none",
                        f"{b.hung_slots} of {b.slots}" if b.slots else "-",
                        "yes" if b.healthy(threshold) else "no",
                    ]
                    for b in beats
                ],
            )
        )
        hung = [b for b in beats if b.all_slots_hung]
        if hung:
            raise CommandError(
                "; ".join(
                    f"worker {b.worker_id} (pid {b.pid}): all {b.slots} slot(s) are held by "
                    "hung jobs past their timeout; it runs nothing until it is restarted"
                    for b in hung
                )
            )
        stale = [b for b in beats if not b.healthy(threshold)]
        if stale:
            raise CommandError(
                f"{len(stale)} of {len(beats)} local worker(s) did not heart-beat within "
                f"{threshold.total_seconds():.0f} s"
            )
