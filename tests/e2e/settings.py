"""Settings for the browser test's worker: the project's, with the gated judge."""

from __future__ import annotations

from config.settings import *  # noqa: F403

RUNS_JUDGE = "tests.e2e.judges.GatedJudge"
