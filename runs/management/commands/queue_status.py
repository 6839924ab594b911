"""Show the per-user analysis queue: what runs, what waits, and each user's balance.
Read-only; safe to run any time."""

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
    help = "Show running, pending and queued analysis jobs per user (read-only)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--user", type=text_argument(max_length=USERNAME_MAX), help="only this username"
        )

    def handle(self, *args, user=None, **options):
        user_id = None
        if user is not None:
            user_id = User.objects.filter(username=user).values_list("pk", flat=True).first()
            if user_id is None:
                raise CommandError(
                    f"no user {user!r}; list users with live work by running queue_status "
                    "without --user"
                )
        rows = queue_overview(user_id=user_id)
        self.stdout.write(
            format_table(
                ["user", "tenant", "balance", "running", "pending", "queued", "queued ids"],
                [
                    [
                        r.username,
                        r.tenant,
                        r.balance,
                        _ids(r.running),
                        _ids(r.pending),
                        len(r.queued),
                        _ids(r.queued),
                    ]
                    for r in rows
                ],
            )
        )
