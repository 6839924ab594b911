"""Exceptions of the queueing framework; ``QueueingError`` is the root."""

from __future__ import annotations

import datetime

__all__ = [
    "DoNotRetry",
    "InvalidKey",
    "JobTimedOut",
    "LeaseLost",
    "LockOutsideTransaction",
    "PollLater",
    "PrerequisiteChanged",
    "QueueingError",
    "RetryLater",
    "RowVanished",
    "UnknownSweep",
    "UnknownTask",
]


class QueueingError(Exception):
    """The queueing framework refused an operation."""

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class InvalidKey(QueueingError, ValueError):
    """A singleton key part is empty, too long or holds a forbidden character."""


class LockOutsideTransaction(QueueingError):
    """A transaction-level advisory lock was requested outside ``transaction.atomic()``:
    in autocommit it would be released at once and protect nothing."""


class UnknownNamespace(QueueingError):
    """This advisory-lock namespace was never declared with ``locks.namespace()``."""


class DuplicateNamespace(QueueingError):
    """This advisory-lock namespace is declared twice: two features would share keys."""


class LeaseLost(QueueingError):
    """The ledger row's fencing token moved on: another worker re-claimed the stage after
    this worker's lease expired, so this worker's result is discarded."""


class PrerequisiteChanged(QueueingError):
    """``Ledger.hold`` found the row the work builds on no longer ``success`` with the
    token seen before the work read its input. ``status`` and
    ``token`` are what it is now (``None``: there is no such row)."""

    def __init__(self, *, status: str | None, token: int | None):
        self.status = status
        self.token = token
        super().__init__(f"the prerequisite is {status or 'missing'} with token {token}")


class RowVanished(QueueingError):
    """An INSERT … ON CONFLICT DO NOTHING hit a conflict, yet the conflicting row could not
    be found afterwards (it was deleted in between)."""


class UnknownTask(QueueingError):
    """No procrastinate task is registered under this name."""


class UnknownSweep(QueueingError):
    """No sweep is declared under this name."""


class RetryLater(QueueingError):
    """Raised by a task to be retried with the framework's capped, jittered backoff.

    ``deadline`` bounds the retries in wall-clock time (the task gives up once no retry
    fits before it); without one the task's ``max_attempts`` bounds them.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        deadline: datetime.datetime | None = None,
    ):
        super().__init__(message)
        self.deadline = deadline


class DoNotRetry(QueueingError):
    """Raised by a task whose failure is final: the job fails at once, without retries."""


class PollLater(QueueingError):
    """Raised by a task whose work a live holder does right now (a stage ledger's *busy*):
    the job waits ``seconds`` (jittered down to half) and runs again. It did not fail, so
    the run is no attempt: however long the holder works, the job's retry budget stays
    whole, and a dead holder's work is taken over on the next poll after stalled recovery
    declared it dead (``queueing.ledger``)."""

    def __init__(self, message: str | None = None, *, seconds: float | None = None):
        super().__init__(message)
        self.seconds = seconds


class JobTimedOut(QueueingError):
    """The job's run outlived its task's timeout (``queueing.timeouts``): the run is over,
    and counts as a failed attempt."""
