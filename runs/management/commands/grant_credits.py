"""Grant analysis credits to a user. Each call adds a ledger entry (not idempotent: do
not put it in a retrying cron job)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import User
from accounts.validation import USERNAME_MAX, text_argument
from queueing.display import format_table
from runs.credits import MAX_CREDITS, NOTE_MAX, credit_grant
from runs.exceptions import InvalidAmount


class Command(BaseCommand):
    help = "Grant N analysis credits to a user and print the new balance."

    def add_arguments(self, parser):
        parser.add_argument(
            "--user", required=True, type=text_argument(max_length=USERNAME_MAX), help="username"
        )
        parser.add_argument(
            "--amount", required=True, type=int, help=f"credits to add (1 to {MAX_CREDITS})"
        )
        parser.add_argument(
            "--note",
            default="",
            type=text_argument(max_length=NOTE_MAX),
            help=f"why (kept in the ledger; at most {NOTE_MAX} characters)",
        )

    def handle(self, *args, user, amount, note="", **options):
        user_id = User.objects.filter(username=user).values_list("pk", flat=True).first()
        if user_id is None:
            raise CommandError(
                f"no user {user!r}; create one with "
                f"'manage.py create_api_token --tenant T --user {user}'"
            )
        try:
            balance = credit_grant(
                user_id=user_id, amount=amount, note=note or "manage.py grant_credits"
            )
        except InvalidAmount as exc:
            raise CommandError(f"{exc}; pass --amount 1 or more (at most {MAX_CREDITS})") from exc
        self.stdout.write(format_table(["user", "granted", "balance"], [[user, amount, balance]]))
