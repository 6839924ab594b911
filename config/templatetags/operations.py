"""Template helpers of the operators' pages (the project-level admin templates).

They live in ``config`` because the Sweeps page is the framework's (``queueing``, which
knows no domain) while what it shows about analyses is the domain's (``runs``).
"""

from __future__ import annotations

from django import template
from django.conf import settings
from django.urls import reverse

from runs.selectors import UNSAVED_AGE_BUCKETS, unsaved_counts_by_age

register = template.Library()

AGE_LABELS = {"under_1h": "under an hour old", "under_24h": "under a day", "over_24h": "older"}


@register.filter
def env_name(setting: str | None) -> str:
    """The environment variable behind a Django setting (they differ for a few)."""
    if not setting:
        return ""
    return settings.SETTING_ENVIRONMENT_NAMES.get(setting, setting)


@register.inclusion_tag("admin/runs/unsaved_runs_summary.html")
def unsaved_runs_summary() -> dict:
    """Finished analyses with no run yet, by age, with links to the filtered job list."""
    counts = unsaved_counts_by_age()
    changelist = reverse("admin:runs_analysisjob_changelist")
    return {
        "total": sum(counts.values()),
        "overdue": sum(n for bucket, n in counts.items() if bucket != UNSAVED_AGE_BUCKETS[0]),
        "grace": int(settings.SWEEP_GRACE_SECONDS),
        "any_url": f"{changelist}?no_run=any",
        "overdue_urls": [
            (AGE_LABELS[bucket], counts[bucket], f"{changelist}?no_run={bucket}")
            for bucket in UNSAVED_AGE_BUCKETS[1:]
        ],
    }
