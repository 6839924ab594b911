"""One way to show a time on the dashboard's pages: the date, the minute and the zone
(``2026-12-01 19:05 UTC``), then how long ago (``3 min ago``). Always in UTC, the zone the
pages' script renders the API's times in, so a row the script builds reads like one the
server rendered; the script (``dashboard.js``: ``when``) follows the same rules and
refreshes the relative part."""

from __future__ import annotations

import datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

#: Shown for a time that is not set yet (a stage not started, an analysis not finished).
MISSING = "—"


def stamp(value: datetime.datetime) -> str:
    """``2026-12-01 19:05 UTC``."""
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def ago(value: datetime.datetime, *, now: datetime.datetime | None = None) -> str:
    """``just now`` under a minute, then whole minutes, hours, days (never in the future:
    a clock a little ahead of the database's reads as just now)."""
    seconds = max(0.0, ((now or timezone.now()) - value).total_seconds())
    if seconds < 60:
        return "just now"
    if seconds < 3600:
        return f"{int(seconds // 60)} min ago"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h ago"
    return f"{int(seconds // 86400)} d ago"


@register.simple_tag
def when(value: datetime.datetime | None) -> str:
    """A ``<time>`` with the date, minute and zone, and the relative hint beside it."""
    if value is None:
        return MISSING
    iso = value.astimezone(datetime.UTC).isoformat()
    return format_html(
        '<time datetime="{}" title="{}">{}</time> <span class="ago" data-since="{}">{}</span>',
        iso,
        iso,
        stamp(value),
        iso,
        ago(value),
    )
