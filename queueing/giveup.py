"""Give-up hooks: when a job will never do its work, its domain settles at once.

A task declared ``@task(name=..., on_give_up=hook)`` gets ``hook(reason=..., **args)``
called, in a transaction, whenever one of its jobs ends without doing its work for good:

* its last attempt failed — the task's retry strategy had no retry left, and the worker
  saved the job ``failed`` (one decision, procrastinate's own). The statement that saves
  the failure also records that the job owes its hook (``pgstage_owed_give_ups``); the
  worker's maintenance thread runs it right after, in a transaction that deletes that
  row. A worker that dies in between, or never hears that its commit landed, leaves the
  row: the next maintenance run of any worker runs the hook (:func:`settle_owed`);
* stalled recovery gave up on it (its workers kept dying: the stall budget is spent);
* an operator cancelled it (``queueing.jobs.job_cancel``, the job admin's action).

So a domain row never stays ``running`` behind a job that is over (DESIGN §5, 13): the
hook marks it failed, refunds, hands the slot on. Hooks must be idempotent (a
compare-and-set on the domain row): a job can be given up on from two places at once,
e.g. its worker's last failure racing an operator's cancel. A hook that raises is logged
(once: it is not run again) and leaves the row to the domain's own resume sweep, which is
bounded too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from django.db import connection, transaction

from queueing.sql import queries

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


def settle_owed(*, job_id: int | None = None, limit: int = 100) -> int:
    """Run give-up hooks still owed (``job_id``'s, or the oldest ``limit``) of the tasks
    whose hooks this process has, each in a transaction of its own that also deletes its
    owed row: committed, the hook ran once; rolled back (this process died), the row
    waits for the next run. Returns how many rows were settled."""
    settled = 0
    while settled < limit:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                queries["take_owed_give_up"], {"job_id": job_id, "hooked": sorted(_hooks)}
            )
            row = cursor.fetchone()
            if row is None:
                break
            owed_job, task_name, args, reason = row
            args = json.loads(args) if isinstance(args, str) else args
            if not give_up(task_name=task_name, args=args, reason=reason):
                logger.warning("job %s owed a give-up hook that did not complete", owed_job)
        settled += 1
        if job_id is not None:
            break
    return settled
