"""The framework's permissions: this model holds no rows and has no table; it only
declares what the admin's Sweeps page checks. (queueing's own tables — the inline sweeps'
clock, job stalls and owed give-up hooks — are made by its migrations in SQL.)"""

from __future__ import annotations

from django.db import models


class SweepPermissions(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("run_sweeps", "Can run, dry-run and queue sweeps from the admin")]

    def __str__(self) -> str:
        return "sweep permissions"
