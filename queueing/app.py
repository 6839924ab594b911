"""The task decorator every pgstage task uses.

It registers the function on procrastinate's Django app with the framework's jittered,
capped retry strategy by default. Django's per-thread connection around each sync job is
procrastinate's Django app's own concern (its ``close_db_connections`` middleware), and
after a database error pgstage's worker renews it (``queueing.worker``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from procrastinate.contrib.django import app as procrastinate_app
from procrastinate.tasks import Task

from queueing import flush, giveup, timeouts
from queueing.backoff import DEFAULT_RETRY

__all__ = ["periodic", "retired_task", "task"]


def task(
    *,
    name: str,
    queue: str = "default",
    retry: Any = DEFAULT_RETRY,
    on_give_up: giveup.GiveUpHook | None = None,
    cancellable: bool | None = None,
    timeout: float | None = None,
    claims_first: bool = False,
    **options: Any,
) -> Callable[[Callable[..., Any]], Task[..., Any, ...]]:
    """``@task(name="pipeline.extract")``: a procrastinate task with pgstage's defaults.

    Names are explicit so a job in the table survives a module move. ``on_give_up(reason=,
    **args)`` settles the task's domain row when a job of it ends without doing its work
    for good (``queueing.giveup``); it must be idempotent. ``cancellable`` (default: when it
    has a hook) lets an operator cancel its waiting jobs; otherwise a cancel is refused,
    since nothing would do the job's work. ``timeout`` bounds one run, in seconds (default
    ``QUEUEING_JOB_TIMEOUT_SECONDS``; 0: no bound): past it the run counts as a failed
    attempt (``queueing.timeouts``). ``claims_first=True`` says the task's first step is a
    transaction that commits (a ledger claim) before it acts outside the database: its
    job's fetch then commits without waiting for its own flush to disk, which the
    claim's carries (``queueing.flush``).
    """
    # Both checked before either is recorded: a refused task leaves nothing behind.
    flush.check(name, claims_first)
    timeouts.declare(name, timeout)
    flush.declare(name, claims_first)

    def decorator(func: Callable[..., Any]) -> Task[..., Any, ...]:
        giveup.register(
            name,
            on_give_up,
            cancellable=on_give_up is not None if cancellable is None else cancellable,
        )
        return procrastinate_app.task(name=name, queue=queue, retry=retry, **options)(func)

    return decorator


def retired_task(*, name: str, on_give_up: giveup.GiveUpHook) -> None:
    """Keep the give-up hook of a task removed from the code, for its jobs still waiting.

    Workers fetch only jobs of tasks they have, so a removed task's jobs wait (the admin,
    ``/metrics`` and the workers' logs show them). An operator cancels them (the job
    admin's cancel, ``queueing.jobs.job_cancel``); with this declaration the cancel, in
    this release, settles each job's domain row through the hook. Drop it once no job of
    the task is left (docs/deploy.md, mixed releases)."""
    giveup.register(name, on_give_up, cancellable=True)


def periodic(
    *, cron: str, periodic_id: str = ""
) -> Callable[[Task[..., Any, ...]], Task[..., Any, ...]]:
    """procrastinate's periodic decorator (cron takes an optional sixth field: seconds)."""
    return procrastinate_app.periodic(cron=cron, periodic_id=periodic_id)
