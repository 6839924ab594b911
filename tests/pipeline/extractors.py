"""Test extractors, plugged in with ``PIPELINE_EXTRACTOR`` (a setting, so production code
has no test hook). Both only interfere with the extract stage (``file_id`` set), never with
the validation at submit time."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from pipeline.extract import Extraction, LineExtractor, ParsedPosition, SourceFile


class GatedExtractor(LineExtractor):
    """For worker subprocesses: touches ``$PIPELINE_TEST_GATE/entered`` and waits until
    ``$PIPELINE_TEST_GATE/release`` exists, so a test can SIGKILL the worker inside extract."""

    def extract(self, source: SourceFile) -> Extraction:
        if source.file_id is not None:
            gate = Path(os.environ["PIPELINE_TEST_GATE"])
            (gate / "entered").touch()
            deadline = time.monotonic() + 60
            while not (gate / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().extract(source)


class ScriptedExtractor(LineExtractor):
    """For in-process tests: optionally blocks (``entered``/``release`` events), then
    raises ``fail_with`` or returns only the first ``keep`` positions."""

    block = False
    entered = threading.Event()
    release = threading.Event()
    fail_with: Exception | None = None
    keep: int | None = None

    @classmethod
    def reset(cls) -> None:
        cls.block = False
        cls.entered = threading.Event()
        cls.release = threading.Event()
        cls.fail_with = None
        cls.keep = None

    def extract(self, source: SourceFile) -> Extraction:
        extraction = super().extract(source)
        if source.file_id is None:
            return extraction
        if self.block:
            self.entered.set()
            assert self.release.wait(timeout=30), "the test never released the extractor"
        if self.fail_with is not None:
            raise self.fail_with
        if self.keep is not None:
            return Extraction(
                positions=extraction.positions[: self.keep], warnings=extraction.warnings
            )
        return extraction


class WildExtractor(LineExtractor):
    """For in-process tests: at extract time, returns ``returns`` (whatever a careless
    plug-in might) instead of what the file holds; at submit time it reads as usual."""

    returns: tuple[ParsedPosition, ...] = ()

    def extract(self, source: SourceFile) -> Extraction:
        extraction = super().extract(source)
        if source.file_id is None:
            return extraction
        positions = tuple(replace(p, file_id=source.file_id) for p in self.returns)
        return Extraction(positions=positions, warnings=extraction.warnings)


class StrayExtractor(LineExtractor):
    """For in-process tests: at extract time, names a file that does not exist as the
    source of every position (a plug-in's bug), which only the database notices, when the
    positions are written (a foreign key)."""

    def extract(self, source: SourceFile) -> Extraction:
        extraction = super().extract(source)
        if source.file_id is None:
            return extraction
        positions = tuple(replace(p, file_id=source.file_id + 10**9) for p in extraction.positions)
        return Extraction(positions=positions, warnings=extraction.warnings)
