"""The release that gave ``review.gains_a_hook`` a give-up hook."""

from __future__ import annotations

from queueing.app import task
from tests.queueing.faults.gated import fail_when_released
from tests.queueing.tasks import record


def _settle(*, reason: str, label: str, **_: object) -> None:
    record(f"gave-up:{label}")


task(name="review.gains_a_hook", on_give_up=_settle)(fail_when_released)
