"""Give-up hooks: when a job will never do its work, its domain settles at once.

A task declared ``@task(name=..., on_give_up=hook)`` gets ``hook(reason=..., **args)``
called, in a transaction, whenever one of its jobs ends without doing its work for good:

* its last attempt failed — the task's own retry strategy has no retry left (the worker's
  :func:`give_up_middleware` asks it, in the job's thread, before procrastinate does);
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


def register(task_name: str, hook: GiveUpHook) -> None:
    if task_name in _hooks and _hooks[task_name] is not hook:
        raise ValueError(f"task {task_name!r} already has a give-up hook")
    _hooks[task_name] = hook


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


def is_final(task: Any, exc: BaseException, job: Any) -> bool:
    """Whether the task's retry strategy retries ``exc`` no more (no strategy: never)."""
    strategy = getattr(task, "retry_strategy", None)
    if strategy is None:
        return True
    return strategy.get_retry_exception(exception=exc, job=job) is None


def give_up_middleware(call_next: Callable[[], Any], context: Any, worker: Any) -> Any:
    """Sync task middleware (runs in the job's thread, on Django's connection): on a
    failure the task's retry strategy will not retry, run the task's give-up hook, then
    let the failure go on to procrastinate, which marks the job failed.

    The strategy is asked again by procrastinate a moment later: "final" stays final as
    time passes (attempts do not shrink, deadlines do not move back), so the hook never
    runs for a job that is then retried."""
    try:
        return call_next()
    except Exception as exc:
        job = context.job
        if has_hook(job.task_name):
            task = worker.app.tasks.get(job.task_name)
            if task is not None and is_final(task, exc, job):
                give_up(
                    task_name=job.task_name,
                    args=job.task_kwargs,
                    reason=f"its job {job.id} failed for good after {job.attempts + 1} "
                    f"attempt(s): {type(exc).__name__}: {exc}",
                )
        raise
