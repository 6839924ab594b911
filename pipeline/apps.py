from __future__ import annotations

from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "Inquiry pipelines"
