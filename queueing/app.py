"""The task decorator every pgstage task uses.

It registers the function on procrastinate's Django app with the framework's jittered,
capped retry strategy by default, and keeps Django's per-thread connection healthy around
each sync job (procrastinate runs sync tasks in a thread pool, where Django's
request-cycle cleanup never runs).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from django.db import close_old_connections
from procrastinate.contrib.django import app as procrastinate_app

from queueing import giveup
from queueing.backoff import DEFAULT_RETRY


def _with_connection_hygiene(func: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        close_old_connections()
        try:
            return func(*args, **kwargs)
        finally:
            close_old_connections()

    return wrapper


def task(
    *,
    name: str,
    queue: str = "default",
    retry: Any = DEFAULT_RETRY,
    on_give_up: giveup.GiveUpHook | None = None,
    cancellable: bool | None = None,
    **options: Any,
):
    """``@task(name="pipeline.extract")``: a procrastinate task with pgstage's defaults.

    Names are explicit so a job in the table survives a module move. ``on_give_up(reason=,
    **args)`` settles the task's domain row when a job of it ends without doing its work
    for good (``queueing.giveup``); it must be idempotent. ``cancellable`` (default: when it
    has a hook) lets an operator cancel its waiting jobs; otherwise a cancel is refused,
    since nothing would do the job's work.
    """

    def decorator(func: Callable[..., Any]):
        giveup.register(
            name,
            on_give_up,
            cancellable=on_give_up is not None if cancellable is None else cancellable,
        )
        return procrastinate_app.task(name=name, queue=queue, retry=retry, **options)(
            _with_connection_hygiene(func)
        )

    return decorator


def periodic(*, cron: str, periodic_id: str = ""):
    """procrastinate's periodic decorator (cron takes an optional sixth field: seconds)."""
    return procrastinate_app.periodic(cron=cron, periodic_id=periodic_id)
