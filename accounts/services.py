"""Writes for tenants, users and tokens."""

from __future__ import annotations

import hashlib
import secrets

from django.db import transaction
from django.utils import timezone

from accounts.models import ApiToken, Tenant, User
from accounts.validation import valid_tenant_slug, valid_token_name, valid_username

TOKEN_PREFIX = "pgs_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def tenant_get_or_create(*, slug: str) -> Tenant:
    """Idempotent: concurrent callers end with the same row (unique slug, get_or_create).
    A slug that is not one (``InvalidText``, a ``ValueError``) creates nothing."""
    valid_tenant_slug(slug)
    tenant, _ = Tenant.objects.get_or_create(slug=slug, defaults={"name": slug})
    return tenant


def user_get_or_create(*, tenant: Tenant, username: str) -> User:
    """Idempotent per username; refuses to move an existing user to another tenant, and a
    name Django's own forms would refuse (``InvalidText``, a ``ValueError``)."""
    valid_username(username, field="user")
    user, created = User.objects.get_or_create(username=username, defaults={"tenant": tenant})
    if not created and user.tenant_id != tenant.id:
        raise ValueError(f"user {username!r} belongs to another tenant ({user.tenant})")
    return user


@transaction.atomic
def api_token_create(*, user: User, name: str = "default") -> str:
    """Create a token and return its plaintext (stored only as a SHA-256 hash)."""
    valid_token_name(name)
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    ApiToken.objects.create(user=user, name=name, prefix=token[:12], token_hash=hash_token(token))
    return token


def api_token_authenticate(*, token: str) -> User | None:
    """Return the token's active user, or None; touches ``last_used_at`` at most once a minute."""
    row = (
        ApiToken.objects.select_related("user", "user__tenant")
        .filter(token_hash=hash_token(token), revoked_at__isnull=True, user__is_active=True)
        .first()
    )
    if row is None:
        return None
    now = timezone.now()
    if row.last_used_at is None or (now - row.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
    return row.user


def api_token_revoke(*, token_id: int) -> bool:
    """Revoke a token at once; idempotent (compare-and-set on ``revoked_at IS NULL``):
    True when this call revoked it, False when it was already revoked or does not exist."""
    return bool(
        ApiToken.objects.filter(pk=token_id, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    )
