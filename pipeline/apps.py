from __future__ import annotations

from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "Inquiry pipelines"

    def ready(self) -> None:
        from pipeline import checks  # noqa: F401  (registers system checks)
