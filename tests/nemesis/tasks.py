"""The generic tasks of the nemesis workload, in both releases (``PGSTAGE_TASK_MODULES``).

Each logs its effects outside the database (:mod:`tests.nemesis.effects`), so the checker
sees every run, including the runs whose outcome the framework fenced off.
"""

from __future__ import annotations

import time

from django.db import transaction

from queueing.app import task
from queueing.backoff import JitteredBackoff
from tests.nemesis.effects import log_effect
from tests.nemesis.forensics import install_dumps

install_dumps()  # every worker imports this module: its stacks on SIGUSR1 and SIGUSR2

EFFECT = "nemesis.effect"
SETTLED = "nemesis.settled"
#: Two attempts, quickly: a failing job gives up within seconds.
QUICK_GIVE_UP = JitteredBackoff(max_attempts=2, base_seconds=0.2, cap_seconds=1.0)


def run_effect(context, *, task_name: str, key: str, hold: float, fail: bool = False) -> None:
    """``start``, hold ``hold`` seconds, then ``end`` (or ``error`` when ``fail``)."""
    job_id = context.job.id
    log_effect("start", task=task_name, key=key, job_id=job_id)
    deadline = time.monotonic() + hold
    while time.monotonic() < deadline:
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if fail:
        log_effect("error", task=task_name, key=key, job_id=job_id)
        raise RuntimeError(f"{key} fails on purpose")
    log_effect("end", task=task_name, key=key, job_id=job_id)


@task(name=EFFECT, pass_context=True)
def effect(context, key: str, hold: float = 0.5) -> None:
    run_effect(context, task_name=EFFECT, key=key, hold=hold)


def log_hook(task_name: str, key: str) -> None:
    """A give-up hook's effects: ``hook`` when it runs, ``hook_committed`` when the
    transaction it runs in (which also deletes its owed row) commits. A hook whose
    transaction rolled back is run again (``queueing.giveup``): once per commit is the
    promise."""
    log_effect("hook", task=task_name, key=key, job_id=None)
    transaction.on_commit(
        lambda: log_effect("hook_committed", task=task_name, key=key, job_id=None)
    )


def settle(*, reason: str, key: str, **_: object) -> None:
    """The give-up hook (no job id: hooks get the job's args)."""
    log_hook(SETTLED, key)


@task(name=SETTLED, pass_context=True, on_give_up=settle, retry=QUICK_GIVE_UP)
def settled(context, key: str, hold: float = 0.2, fail: bool = False) -> None:
    run_effect(context, task_name=SETTLED, key=key, hold=hold, fail=fail)
