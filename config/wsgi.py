"""WSGI entry point for pgstage."""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured
from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
application = get_wsgi_application()

# A WSGI server runs no system checks: refuse here to serve with insecure settings.
from config.checks import insecure_settings  # noqa: E402  (needs the settings loaded)

if errors := insecure_settings():
    raise ImproperlyConfigured("; ".join(f"{e.id}: {e.msg} {e.hint}" for e in errors))
