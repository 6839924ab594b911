"""System checks of the deployment settings (docs/security.md).

``site.E001`` is an error, not a ``--deploy`` warning: with DEBUG off the built-in
development key would sign production sessions and CSRF tokens with a key anyone can
read in this repository, so every command refuses to start with it, and so does the
WSGI application (``config.wsgi``), which no command starts.
"""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, register

from config.settings import DEVELOPMENT_SECRET_KEY


def insecure_settings() -> list[Error]:
    errors = []
    if not settings.DEBUG and settings.SECRET_KEY == DEVELOPMENT_SECRET_KEY:
        errors.append(
            Error(
                "DEBUG is off but SECRET_KEY is the built-in development key.",
                hint=(
                    "Set SECRET_KEY in the environment to a long random value, e.g. "
                    "python -c 'import secrets; print(secrets.token_urlsafe(50))' "
                    "(or DEBUG=true for development)."
                ),
                id="site.E001",
            )
        )
    return errors


@register()
def check_secret_key(app_configs, **kwargs):
    return insecure_settings()
