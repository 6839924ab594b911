"""Tenants, their users and hashed API tokens."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models


class Tenant(models.Model):
    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "tenants"
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug


class User(AbstractUser):
    """A person; every API call is scoped to the user's tenant."""

    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="users", null=True, blank=True
    )

    class Meta:
        db_table = "users"


class ApiToken(models.Model):
    """A bearer token; only its SHA-256 is stored, the plaintext is shown once."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, default="default")
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a token.")
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "api_tokens"
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class AuthFailure(models.Model):
    """Failed authentications (wrong passwords, wrong or revoked tokens) of one client
    address in its current window. Kept in PostgreSQL, so every web process counts the
    same failures and a restart forgets none (``accounts.throttle``)."""

    scope = models.CharField(max_length=16)
    address = models.CharField(max_length=64)
    window_start = models.DateTimeField()
    failures = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "auth_failures"
        constraints = [
            models.UniqueConstraint(fields=["scope", "address"], name="auth_failures_address_uq")
        ]
        indexes = [models.Index(fields=["window_start"], name="auth_failures_window_idx")]

    def __str__(self) -> str:
        return f"{self.scope} {self.address}: {self.failures}"
