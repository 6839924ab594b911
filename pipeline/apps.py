from __future__ import annotations

from django.apps import AppConfig


class PipelineConfig(AppConfig):
    name = "pipeline"
    verbose_name = "Inquiry pipelines"

    def ready(self) -> None:
        from pipeline import checks  # noqa: F401  (registers system checks)
        from pipeline.stages import STAGE_KEY
        from queueing.logs import register_key_format

        # Stage keys name their tenant: job log lines show it.
        register_key_format(STAGE_KEY)
