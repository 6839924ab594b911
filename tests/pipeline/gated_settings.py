"""Settings for a worker subprocess whose extractor blocks on a gate directory."""

from __future__ import annotations

from config.settings import *  # noqa: F403

PIPELINE_EXTRACTOR = "tests.pipeline.extractors.GatedExtractor"
