"""Template helpers of the framework's admin pages (the Sweeps page)."""

from __future__ import annotations

from django import template
from django.conf import settings
from django.utils.module_loading import import_string

register = template.Library()


@register.filter
def env_name(setting: str | None) -> str:
    """The environment variable behind a Django setting, where a project names them
    differently (``SETTING_ENVIRONMENT_NAMES``); else the setting's own name."""
    if not setting:
        return ""
    return getattr(settings, "SETTING_ENVIRONMENT_NAMES", {}).get(setting, setting)


@register.simple_tag
def sweeps_summary() -> str:
    """What a project shows above the sweeps table: the HTML returned by the callable
    ``QUEUEING_SWEEPS_SUMMARY`` names (a dotted path; nothing when unset). It reads only."""
    path = getattr(settings, "QUEUEING_SWEEPS_SUMMARY", "")
    return import_string(path)() if path else ""
