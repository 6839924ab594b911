"""A judge that holds each citation until its source's gate file exists, so a browser
test can see an analysis *running* (the offline judge finishes in milliseconds)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from runs.judge import Judgement, OverlapJudge, Source

#: Far above any test's patience: a gate nobody opens must fail the test, not pass it.
GATE_TIMEOUT_SECONDS = 60


class GatedJudge(OverlapJudge):
    """Judges like the default once ``$E2E_JUDGE_GATES/<source key>`` exists."""

    def judge(self, *, claim: str, source: Source | None) -> Judgement:
        if source is not None:
            gate = Path(os.environ["E2E_JUDGE_GATES"]) / source.key
            deadline = time.monotonic() + GATE_TIMEOUT_SECONDS
            while not gate.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        return super().judge(claim=claim, source=source)
