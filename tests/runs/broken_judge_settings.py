"""Settings for worker subprocesses that meet a crashing judge and give up quickly."""

from __future__ import annotations

from config.settings import *  # noqa: F403

RUNS_JUDGE = "tests.runs.fakes.BrokenJudge"
QUEUEING_RETRY_MAX_ATTEMPTS = 2
QUEUEING_RETRY_BASE_SECONDS = 0.05
QUEUEING_RETRY_CAP_SECONDS = 0.1
