"""The job the current code runs in, for pieces that tie their state to it (a stage
ledger's claim records its holder's job, so that a holder stalled recovery took back
loses its lease at once; ``queueing.ledger``).

The worker sets it around each job (``queueing.worker``); outside a job it is None.
A context variable: each job's thread (sync tasks) or task (async ones) sees its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_job_id: ContextVar[int | None] = ContextVar("pgstage_current_job_id", default=None)


def job_id() -> int | None:
    """The procrastinate job id this code runs in, or None outside a job."""
    return _job_id.get()


@contextmanager
def running(job_id: int | None) -> Iterator[None]:
    """Mark the block as running job ``job_id`` (the worker's job middleware)."""
    token = _job_id.set(job_id)
    try:
        yield
    finally:
        _job_id.reset(token)
