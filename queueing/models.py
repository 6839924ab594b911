"""The framework's permissions. queueing keeps no table of its own: this model holds no
rows and has none; it only declares what the admin's Sweeps page checks."""

from __future__ import annotations

from django.db import models


class SweepPermissions(models.Model):
    class Meta:
        managed = False
        default_permissions = ()
        permissions = [("run_sweeps", "Can run, dry-run and queue sweeps from the admin")]

    def __str__(self) -> str:
        return "sweep permissions"
