from __future__ import annotations

from django.apps import AppConfig


class QueueingConfig(AppConfig):
    name = "queueing"
    verbose_name = "Queueing framework"

    def ready(self) -> None:
        from queueing import checks  # noqa: F401  (registers system checks)
