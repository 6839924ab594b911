"""A job body shared by the two releases of ``review.gains_a_hook`` (``hook_before``,
``hook_after``): it registers no task itself."""

from __future__ import annotations

import time
from pathlib import Path

from queueing.exceptions import DoNotRetry
from tests.queueing.tasks import record


def fail_when_released(label: str, gate: str) -> None:
    """Say it started, wait for ``gate``, fail for good."""
    record(f"ran:{label}")
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    raise DoNotRetry(f"{label} fails for good")
