"""What the framework's Sweeps page shows above its table for this site: the finished
analyses with no run yet (``QUEUEING_SWEEPS_SUMMARY`` names :func:`unsaved_runs_summary`).

It lives in ``config`` because the Sweeps page is the framework's (``queueing``, which
knows no domain) while what it shows about analyses is the domain's (``runs``).
"""

from __future__ import annotations

from django.conf import settings
from django.template.loader import render_to_string
from django.urls import reverse

from runs.selectors import UNSAVED_AGE_BUCKETS, unsaved_counts_by_age

AGE_LABELS = {"under_1h": "under an hour old", "under_24h": "under a day", "over_24h": "older"}


def unsaved_runs_summary() -> str:
    """Finished analyses with no run yet, by age, with links to the filtered job list."""
    counts = unsaved_counts_by_age()
    changelist = reverse("admin:runs_analysisjob_changelist")
    context = {
        "total": sum(counts.values()),
        "overdue": sum(n for bucket, n in counts.items() if bucket != UNSAVED_AGE_BUCKETS[0]),
        "grace": int(settings.SWEEP_GRACE_SECONDS),
        "any_url": f"{changelist}?no_run=any",
        "overdue_urls": [
            (AGE_LABELS[bucket], counts[bucket], f"{changelist}?no_run={bucket}")
            for bucket in UNSAVED_AGE_BUCKETS[1:]
        ],
    }
    return render_to_string("admin/runs/unsaved_runs_summary.html", context)
