"""Settings for worker subprocesses of the runs tests: the project's, with the flaky core."""

from __future__ import annotations

from config.settings import *  # noqa: F403

RUNS_CORE_CLIENT = "tests.runs.fakes.FlakyCore"
