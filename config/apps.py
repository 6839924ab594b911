from __future__ import annotations

from django.apps import AppConfig


class SiteConfig(AppConfig):
    """The reference site itself: the demo command, the dashboard and its metrics."""

    name = "config"
    label = "site"
    verbose_name = "pgstage"

    def ready(self) -> None:
        from config import checks  # noqa: F401  (registers the deployment checks)
