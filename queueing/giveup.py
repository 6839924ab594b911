"""Give-up hooks: when a job will never do its work, its domain settles at once.

A task declared ``@task(name=..., on_give_up=hook)`` gets ``hook(reason=..., **args)``
called, in a transaction, whenever one of its jobs ends without doing its work for good.
Every path that decides so records, in the statement that changes the job's status, that
the job owes its hook (a row of ``pgstage_owed_give_ups``):

* its last attempt failed, or it was aborted — the worker's statement that saves the
  outcome (``finish_job_fenced`` / ``retry_job_fenced``);
* stalled recovery gave up on it (its workers kept dying: the stall budget is spent; or
  its abort was requested and its worker died) — ``end_stalled_job``, whichever worker
  (or operator's retry) ran the recovery;
* an operator cancelled it (``queueing.jobs.job_cancel``, the job admin's action) —
  ``cancel_waiting_job``.

A job that is *superseded* (a waiting job with its singleton key does the same work) owes
nothing. Only a process that has the task's hook runs it (:func:`settle_owed`), in a
transaction that deletes the owed row: a worker's hooks thread, every maintenance period,
and right after its own give-ups; a cancel, in the cancel's own transaction. A process
that does not know the task at all (another release, other ``PGSTAGE_TASK_MODULES``)
records the row anyway (:func:`owes`), and so does one that knows the task without a hook:
a worker of the next release may have it. A process that has the hook settles the row;
one that knows the task without a hook deletes the row only once no worker that
registered the hook (``pgstage_worker_tasks.hooks``) may be alive (an outage makes every
heartbeat old). So a hook is never lost, nor run by a worker that cannot run it — a
hook added to an existing task in a new release runs for the jobs an old worker fails
beside the new ones (when the old release is one that records every give-up). A task
removed from the code can keep its hook for its jobs still waiting
(:func:`queueing.app.retired_task`).

So a domain row never stays ``running`` behind a job that is over (invariant 13 of
docs/design.md): the hook marks it failed, refunds, hands the slot on. Hooks must be idempotent (a
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


def known_tasks() -> set[str]:
    """The task names this process knows: its procrastinate tasks, and retired tasks
    whose hook it keeps."""
    from procrastinate.contrib.django import app

    return set(app.tasks) | set(_hooks)


def hooked_tasks() -> list[str]:
    """The task names this process has a give-up hook of (registered with its worker)."""
    return sorted(_hooks)


def owes(task_name: str) -> bool:
    """Whether giving up on a job of ``task_name`` records an owed hook: always, whether
    or not this process has the hook — a worker of the next release may have it (a hook
    added to an existing task), or one of another task set. The one place that decides;
    a superseded job's path records nothing and does not ask."""
    return True


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
    """Settle give-ups still owed (``job_id``'s, or the oldest ``limit``) of the tasks this
    process knows, each in a transaction of its own (a savepoint inside the caller's) that
    also deletes its owed row: committed, the hook ran once; rolled back (this process
    died), the row waits for the next run. A known task without a hook here: its row just
    goes, unless a worker that may be alive registered the hook (a newer release), which
    runs it: one silent for less than ``prune_after_seconds`` (after an outage, every
    heartbeat is old). Rows of tasks this process does not know stay for one that does.
    Returns how many rows were settled."""
    from queueing.worker import prune_after_seconds

    settled = 0
    while settled < limit:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                queries["take_owed_give_up"],
                {
                    "job_id": job_id,
                    "known": sorted(known_tasks()),
                    "hooked": hooked_tasks(),
                    "seconds": prune_after_seconds(),
                },
            )
            row = cursor.fetchone()
            if row is None:
                break
            owed_job, task_name, args, reason = row
            args = json.loads(args) if isinstance(args, str) else args
            if not has_hook(task_name):
                logger.info("job %s (%s) was given up on; no hook to run", owed_job, task_name)
            elif not give_up(task_name=task_name, args=args, reason=reason):
                logger.warning("job %s owed a give-up hook that did not complete", owed_job)
        settled += 1
        if job_id is not None:
            break
    return settled
