"""The framework's permissions: this model holds no rows and has no table; it only
declares what the admin's Sweeps page (``run_sweeps``) and ``/metrics`` (``view_metrics``)
check. (queueing's own tables — the inline sweeps' clock, job stalls, owed give-up hooks
and the metrics snapshot — are made by its migrations in SQL.)"""

from __future__ import annotations

from django.db import models


class SweepPermissions(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("run_sweeps", "Can run, dry-run and queue sweeps from the admin"),
            ("view_metrics", "Can read /metrics"),
        ]

    def __str__(self) -> str:
        return "sweep permissions"
