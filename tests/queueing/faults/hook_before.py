"""The release before ``review.gains_a_hook`` had a give-up hook: the task without one."""

from __future__ import annotations

from queueing.app import task
from tests.queueing.faults.gated import fail_when_released

task(name="review.gains_a_hook")(fail_when_released)
