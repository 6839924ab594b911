"""Create an API token for a user (creating tenant and user if missing). Not for cron."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from accounts.services import api_token_create, tenant_get_or_create, user_get_or_create
from accounts.validation import (
    InvalidText,
    valid_tenant_slug,
    valid_token_name,
    valid_username,
)


class Command(BaseCommand):
    help = "Create an API token; creates the tenant and user if missing. Prints the token last."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug (at most 64 characters)")
        parser.add_argument(
            "--user", required=True, help="username: letters, digits and @.+-_ (at most 150)"
        )
        parser.add_argument(
            "--name", default="default", help="a label for the token (at most 100 characters)"
        )

    def handle(self, *args, tenant: str, user: str, name: str, **options):
        try:
            valid_tenant_slug(tenant, field="--tenant")
            valid_username(user, field="--user")
            valid_token_name(name, field="--name")
        except InvalidText as exc:
            raise CommandError(f"{exc}; nothing was created.") from exc
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
