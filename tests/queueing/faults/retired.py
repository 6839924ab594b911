"""Loaded into a worker of the release that removed the task ``review.removed``: its code
is gone, its give-up hook is kept for the jobs still waiting (``retired_task``)."""

from __future__ import annotations

from queueing.app import retired_task
from tests.queueing.tasks import record


def _settle(*, reason: str, label: str, **_: object) -> None:
    record(f"gave-up:{label}")


retired_task(name="review.removed", on_give_up=_settle)
