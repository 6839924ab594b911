"""Give-up hooks: when a job will never do its work, its domain settles at once.

A task declared ``@task(name=..., on_give_up=hook)`` gets ``hook(reason=..., **args)``
called, in a transaction, whenever one of its jobs ends without doing its work for good:

* its last attempt failed — the task's retry strategy had no retry left, and the worker
  saved the job ``failed`` (the hook runs right after, in the worker's maintenance
  thread: one decision, procrastinate's own);
* stalled recovery gave up on it (its workers kept dying: the stall budget is spent);
* an operator cancelled it (``queueing.jobs.job_cancel``, the job admin's action).

So a domain row never stays ``running`` behind a job that is over (DESIGN §5, 13): the
hook marks it failed, refunds, hands the slot on. Hooks must be idempotent (a
compare-and-set on the domain row): a job can be given up on from two places at once,
e.g. its worker's last failure racing an operator's cancel. A hook that raises is logged
and leaves the row to the domain's own resume sweep, which is bounded too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)

GiveUpHook = Callable[..., None]
_hooks: dict[str, GiveUpHook] = {}
_cancellable: set[str] = set()


def register(task_name: str, hook: GiveUpHook | None, *, cancellable: bool) -> None:
    """Declare ``task_name``'s hook (if any), and whether an operator may cancel its
    jobs: only when nothing is lost by it (a hook settles the domain, or the task's work
    is redone anyway, e.g. a sweep's next tick)."""
    if hook is not None:
        if task_name in _hooks and _hooks[task_name] is not hook:
            raise ValueError(f"task {task_name!r} already has a give-up hook")
        _hooks[task_name] = hook
    if cancellable:
        _cancellable.add(task_name)


def is_cancellable(task_name: str) -> bool:
    return task_name in _cancellable


def has_hook(task_name: str) -> bool:
    return task_name in _hooks


def give_up(*, task_name: str, args: Mapping[str, Any], reason: str) -> bool:
    """Run ``task_name``'s hook in a transaction (a savepoint inside the caller's); True
    when a hook ran. Never raises: a failing hook is logged."""
    hook = _hooks.get(task_name)
    if hook is None:
        return False
    try:
        with transaction.atomic():
            hook(reason=reason[:2000], **args)
    except Exception:
        logger.exception("the give-up hook of %s%r failed", task_name, dict(args))
        return False
    logger.warning("gave up on %s%r: %s", task_name, dict(args), reason)
    return True
