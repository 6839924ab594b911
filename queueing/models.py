"""The framework's permissions. This model is unmanaged: it has no table and holds no
rows; it only declares what the admin's Sweeps page (``run_sweeps``) and ``/metrics``
(``view_metrics``) check."""

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
