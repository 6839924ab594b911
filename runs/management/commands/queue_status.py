"""Show the per-user analysis queues: what runs, what waits, what finished without a run
yet, and each user's balance. Read-only; safe to run any time."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from accounts.validation import USERNAME_MAX, text_argument
from queueing.display import format_table
from runs.selectors import queue_overview


def _ids(ids: tuple[int, ...], *, limit: int = 8) -> str:
    shown = ", ".join(map(str, ids[:limit]))
    return shown + (f" … (+{len(ids) - limit})" if len(ids) > limit else "")


class Command(BaseCommand):
    help = (
        "Show every user's analysis queue: running, pending and queued jobs, finished ones "
        "and those with no run yet, and the balance (read-only)."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--user", type=text_argument(max_length=USERNAME_MAX), help="only this username"
        )
        parser.add_argument(
            "--live", action="store_true", help="only users with queued or active work"
        )

    def handle(self, *args, user=None, live=False, **options):
        user_id = None
        if user is not None:
            user_id = User.objects.filter(username=user).values_list("pk", flat=True).first()
            if user_id is None:
                raise CommandError(
                    f"no user {user!r}; list every user with a queue by running queue_status "
                    "without --user"
                )
        rows = queue_overview(user_id=user_id, live_only=live)
        self.stdout.write(
            format_table(
                [
                    "user",
                    "tenant",
                    "balance",
                    "running",
                    "pending",
                    "queued",
                    "finished",
                    "no run yet",
                    "active and queued ids",
                ],
                [
                    [
                        r.username,
                        r.tenant,
                        r.balance,
                        len(r.running),
                        len(r.pending),
                        len(r.queued),
                        r.finished,
                        r.unsaved,
                        _ids(r.running + r.pending + r.queued),
                    ]
                    for r in rows
                ],
            )
        )
