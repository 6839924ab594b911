"""The task only the new release has (``PGSTAGE_TASK_MODULES`` of a new worker adds it)."""

from __future__ import annotations

from queueing.app import task
from tests.nemesis.effects import log_effect
from tests.nemesis.tasks import QUICK_GIVE_UP, run_effect

NEW_EFFECT = "nemesis.new_effect"


def settle_new(*, reason: str, key: str, **_: object) -> None:
    log_effect("hook", task=NEW_EFFECT, key=key, job_id=None)


@task(name=NEW_EFFECT, pass_context=True, on_give_up=settle_new, retry=QUICK_GIVE_UP)
def new_effect(context, key: str, hold: float = 0.3, fail: bool = False) -> None:
    run_effect(context, task_name=NEW_EFFECT, key=key, hold=hold, fail=fail)
