"""System checks of the deployment settings (docs/security.md).

``site.E001`` is an error, not a ``--deploy`` warning: with DEBUG off a weak key — the
built-in development key, which anyone can read in this repository, or one that Django's
own deployment check calls weak (security.W009: shorter than 50 characters, fewer than 5
different ones, or ``django-insecure-``) — would sign production sessions and CSRF tokens,
so every command refuses to start with it, and so does the WSGI application
(``config.wsgi``), which no command starts. ``site.E003`` refuses a negative bound: 0
turns a bound off, and a negative one has no meaning.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register
from django.core.checks.security.base import (
    SECRET_KEY_INSECURE_PREFIX,
    SECRET_KEY_MIN_LENGTH,
    SECRET_KEY_MIN_UNIQUE_CHARACTERS,
)

from config.settings import DEVELOPMENT_SECRET_KEY

#: The per-user, per-tenant and per-address bounds (docs/security.md): 0 is off.
BOUNDS = (
    "AUTH_FAILURE_LIMIT",
    "AUTH_FAILURE_WINDOW_SECONDS",
    "CORE_DAILY_BUDGET",
    "MAX_QUEUED_ANALYSES_PER_USER",
    "MAX_INQUIRIES_PER_TENANT_PER_HOUR",
)
KEY_HINT = (
    "Set SECRET_KEY in the environment to a long random value, e.g. "
    "python -c 'import secrets; print(secrets.token_urlsafe(50))' "
    "(or DEBUG=true for development)."
)


def weak_secret_key(key: str) -> str | None:
    """Why ``key`` may not sign anything in production, or None."""
    if key == DEVELOPMENT_SECRET_KEY:
        return "SECRET_KEY is the built-in development key"
    if (
        len(key) < SECRET_KEY_MIN_LENGTH
        or len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS
        or key.startswith(SECRET_KEY_INSECURE_PREFIX)
    ):
        return (
            f"SECRET_KEY is weak: it needs at least {SECRET_KEY_MIN_LENGTH} characters, "
            f"{SECRET_KEY_MIN_UNIQUE_CHARACTERS} of them different, and no "
            f"{SECRET_KEY_INSECURE_PREFIX!r} prefix"
        )
    return None


def insecure_settings() -> list[Error]:
    errors = []
    if not settings.DEBUG and (reason := weak_secret_key(str(settings.SECRET_KEY))):
        errors.append(Error(f"DEBUG is off but {reason}.", hint=KEY_HINT, id="site.E001"))
    for name in BOUNDS:
        if int(getattr(settings, name)) < 0:
            errors.append(
                Error(
                    f"{name} is negative.",
                    hint="Use 0 to turn the bound off, or a positive bound.",
                    id="site.E003",
                )
            )
    return errors


@register()
def check_secret_key(app_configs, **kwargs):
    return insecure_settings()
