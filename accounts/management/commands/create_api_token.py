"""Create an API token for a user (creating tenant and user if missing). Not for cron."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.services import api_token_create, tenant_get_or_create, user_get_or_create


class Command(BaseCommand):
    help = "Create an API token; creates the tenant and user if missing. Prints the token last."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--user", required=True, help="username")
        parser.add_argument("--name", default="default", help="a label for the token")

    def handle(self, *args, tenant: str, user: str, name: str, **options):
        from django.utils.text import slugify

        if not tenant or slugify(tenant) != tenant:
            raise CommandError(f"--tenant {tenant!r} is not a slug: use lowercase, digits and '-'.")
        if not user.strip():
            raise CommandError("--user must not be empty.")
        try:
            # One transaction: a refused user leaves no half-created tenant behind.
            with transaction.atomic():
                tenant_row = tenant_get_or_create(slug=tenant)
                user_row = user_get_or_create(tenant=tenant_row, username=user)
                token = api_token_create(user=user_row, name=name)
        except ValueError as exc:
            raise CommandError(f"{exc}; pick another --user or --tenant.") from exc
        self.stderr.write(f"token for {user_row.username} (tenant {tenant_row.slug}):")
        self.stdout.write(token)
