"""Tasks for the review's fault tests, run in real worker subprocesses."""

from __future__ import annotations

import time
from pathlib import Path

from queueing.app import task
from queueing.exceptions import DoNotRetry
from tests.queueing.tasks import record


def _settle_slowly(*, reason: str, label: str, gate: str, **_: object) -> None:
    """A give-up hook that says (outside the database) that it started, then waits for
    ``gate`` before it settles the "domain" (an effect, committed with the hook)."""
    Path(f"{gate}.hook-started").touch()
    deadline = time.monotonic() + 60
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    record(f"gave-up:{label}")


@task(name="review.fails_for_good", on_give_up=_settle_slowly)
def fails_for_good(label: str, gate: str) -> None:
    raise DoNotRetry(f"{label} fails for good")


def _settle(*, reason: str, label: str, **_: object) -> None:
    record(f"gave-up:{label}")


@task(name="review.fails_once_for_good", on_give_up=_settle)
def fails_once_for_good(label: str) -> None:
    record(f"ran:{label}")
    raise DoNotRetry(f"{label} fails for good")


@task(name="review.added_in_next_release", on_give_up=_settle)
def added_in_next_release(label: str) -> None:
    """A task only the next release's workers have (they load this module)."""
    record(f"ran:{label}")
