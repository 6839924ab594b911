"""System checks for the settings the framework relies on."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.db import connections


@register()
def check_database(app_configs, **kwargs):
    errors = []
    engine = connections["default"].settings_dict.get("ENGINE", "")
    if "postgresql" not in engine:
        errors.append(
            Error(
                "pgstage needs PostgreSQL: advisory locks, partial unique indexes and "
                "SKIP LOCKED have no equivalent elsewhere.",
                hint="Set DATABASE_URL=postgresql://… or unset it to use the embedded server.",
                id="queueing.E001",
            )
        )
    if "procrastinate.contrib.django" not in settings.INSTALLED_APPS:
        errors.append(
            Error(
                "queueing needs 'procrastinate.contrib.django' in INSTALLED_APPS.",
                id="queueing.E002",
            )
        )
    grace = getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30)
    if grace < 20:
        errors.append(
            Warning(
                f"QUEUEING_STALLED_WORKER_SECONDS={grace} is shorter than two heartbeats "
                "(procrastinate beats every 10 s): live workers would be treated as dead.",
                hint="Use 30 seconds or more.",
                id="queueing.W001",
            )
        )
    return errors
