"""Transactional enqueue with pg-boss singleton policies, on Django's connection.

``enqueue`` inserts the procrastinate job with one statement on Django's connection, so it
commits or rolls back with the surrounding ``transaction.atomic()`` — in a request, in a
command, and inside a running task (where procrastinate's own ``defer()`` would go through
the worker's pool and commit on its own: docs/design.md#procrastinate-traps).

Policies (pg-boss's names):

* ``NONE``: no deduplication.
* ``SHORT``: at most one *waiting* job per key (procrastinate's ``queueing_lock``, which
  covers ``todo`` jobs, retries waiting for their time included).
* ``EXCLUSIVE``: at most one job per key across waiting, retrying and running (our partial
  unique index ``pgstage_jobs_exclusive_key`` over ``todo`` and ``doing``).

A deduplicated enqueue does not raise and does not abort the caller's transaction (it is
``ON CONFLICT DO NOTHING``, not a caught unique violation): it returns the existing job's
id with ``created=False``.
"""

from __future__ import annotations

import datetime
import enum
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.utils import timezone
from procrastinate import tasks as procrastinate_tasks
from psycopg.types.json import Jsonb

from queueing import sql
from queueing.exceptions import QueueingError, UnknownTask
from queueing.keys import KeyFormat, validate_key
from queueing.sql import queries

__all__ = ["Enqueued", "Policy", "enqueue", "job_params"]

EXCLUSIVE_PREFIX = "exclusive/"
#: Attempts to either insert or find the existing job: a lookup can miss when the
#: conflicting job finishes between the two statements, and then the insert succeeds.
_MAX_ROUNDS = 5


class Policy(enum.StrEnum):
    NONE = "none"
    SHORT = "short"
    EXCLUSIVE = "exclusive"


@dataclass(frozen=True, kw_only=True)
class Enqueued:
    job_id: int
    created: bool


def queueing_lock_prefix(key_format: KeyFormat, policy: Policy, **leading: object) -> str:
    """The queueing lock of every key of ``key_format`` with these leading parts, up to its
    last part: for SQL that appends the last part (an id column) and probes the lock
    indexes for many jobs at once. ``KeyFormat.leading`` builds the key part."""
    if policy is Policy.NONE:
        raise QueueingError("keys without a policy hold no queueing lock")
    text = key_format.leading(**leading)
    return EXCLUSIVE_PREFIX + text if policy is Policy.EXCLUSIVE else text


def queueing_lock_for(key: str | None, policy: Policy) -> str | None:
    """The ``queueing_lock`` value stored for ``key`` under ``policy``."""
    if policy is Policy.NONE:
        if key is not None:
            raise QueueingError("a key needs a policy (SHORT or EXCLUSIVE)")
        return None
    if key is None:
        raise QueueingError(f"policy {policy} needs a singleton key")
    validate_key(key)
    return EXCLUSIVE_PREFIX + key if policy is Policy.EXCLUSIVE else key


def _task_defaults(task: str | procrastinate_tasks.Task) -> tuple[str, str, int]:
    if isinstance(task, procrastinate_tasks.Task):
        return task.name, task.queue, task.priority
    from procrastinate.contrib.django import app

    registered = app.tasks.get(task)
    if registered is None:
        # A job for a task no worker knows would sit in the table until a worker fails it.
        raise UnknownTask(
            f"no task named {task!r} is registered: declare it with @queueing.app.task in "
            "the tasks.py of an installed app (or import its module)"
        )
    return registered.name, registered.queue, registered.priority


def job_params(
    task: str | procrastinate_tasks.Task,
    *,
    args: dict[str, Any] | None = None,
    key: str | None = None,
    policy: Policy = Policy.NONE,
    queue: str | None = None,
    priority: int | None = None,
    schedule_at: datetime.datetime | None = None,
    schedule_in: datetime.timedelta | None = None,
) -> dict[str, Any]:
    """The bound parameters of a job's INSERT (``enqueue``'s, and the ledger's complete
    that enqueues the next stage in the same statement): the task checked, the key
    validated under its policy."""
    task_name, task_queue, task_priority = _task_defaults(task)
    if schedule_in is not None:
        if schedule_at is not None:
            raise QueueingError("pass schedule_at or schedule_in, not both")
        schedule_at = timezone.now() + schedule_in
    return {
        "queue": queue or task_queue,
        "task_name": task_name,
        "priority": task_priority if priority is None else priority,
        "queueing_lock": queueing_lock_for(key, policy),
        "args": Jsonb(args or {}),
        "scheduled_at": schedule_at,
        "statuses": ["todo", "doing"] if policy is Policy.EXCLUSIVE else ["todo"],
    }


def enqueue(
    task: str | procrastinate_tasks.Task,
    *,
    args: dict[str, Any] | None = None,
    key: str | None = None,
    policy: Policy = Policy.NONE,
    queue: str | None = None,
    priority: int | None = None,
    schedule_at: datetime.datetime | None = None,
    schedule_in: datetime.timedelta | None = None,
    using: str = "default",
) -> Enqueued:
    """Enqueue ``task`` on Django's connection ``using``, inside the caller's transaction.

    One round trip when the job is created; deduplication by ``key`` under ``policy`` is
    race-free (a unique index decides) and returns the existing id with ``created=False``.
    """
    params = job_params(
        task,
        args=args,
        key=key,
        policy=policy,
        queue=queue,
        priority=priority,
        schedule_at=schedule_at,
        schedule_in=schedule_in,
    )
    queueing_lock = params["queueing_lock"]
    with sql.statement_cursor(connections[using]) as cursor:
        for _ in range(_MAX_ROUNDS):
            cursor.execute(queries["enqueue"], params)
            row = cursor.fetchone()
            if row is None and queueing_lock is not None:
                # The conflicting job committed after this statement's snapshot: a fresh
                # statement sees it (or, if it already finished, the next insert wins).
                cursor.execute(queries["enqueue_lookup"], params)
                found = cursor.fetchone()
                if found is not None:
                    return Enqueued(job_id=found[0], created=False)
                continue
            return Enqueued(job_id=row[0], created=row[1])
    raise QueueingError(
        f"could not enqueue {params['task_name']} with key {key!r}: it kept changing"
    )
