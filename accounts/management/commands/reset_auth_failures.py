"""Lift lockouts: forget the failed logins and token authentications of one client address
(or of all). Safe to run at any time, also from cron; idempotent."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.models import AuthFailure
from accounts.throttle import LOGIN, TOKEN, auth_failures_reset, locked_until
from accounts.validation import text_argument

ADDRESS_MAX = AuthFailure._meta.get_field("address").max_length


class Command(BaseCommand):
    help = (
        "List the addresses with failed authentications (--list), or forget the failures "
        "of --address ADDRESS or of --all, lifting their lockout."
    )

    def add_arguments(self, parser):
        what = parser.add_mutually_exclusive_group(required=True)
        what.add_argument(
            "--list", dest="list_only", action="store_true", help="show the counts, change nothing"
        )
        what.add_argument(
            "--address", type=text_argument(max_length=ADDRESS_MAX), help="a client address"
        )
        what.add_argument("--all", dest="every", action="store_true", help="every address")
        parser.add_argument(
            "--scope", choices=[LOGIN, TOKEN], help="only logins or only API tokens"
        )

    def handle(self, *args, list_only: bool, address: str | None, scope, **options):
        if list_only:
            rows = AuthFailure.objects.order_by("-failures", "address")
            if scope is not None:
                rows = rows.filter(scope=scope)
            for f in rows:
                until = locked_until(f)
                self.stdout.write(
                    f"{f.address}\t{f.scope}\t{f.failures} failure(s) since "
                    f"{f.window_start.isoformat(timespec='seconds')}\t"
                    + (f"locked out until {until.isoformat(timespec='seconds')}" if until else "")
                )
            self.stdout.write(f"{rows.count()} address(es) with failures")
            return
        if address is not None and not address.strip():
            raise CommandError("--address must not be empty")
        deleted = auth_failures_reset(address=address, scope=scope)
        self.stdout.write(
            f"forgot {deleted} failure count(s)"
            + (f" of {address}" if address is not None else "")
            + "; the lockout is lifted."
        )
