"""The job the current code runs in, for pieces that tie their state to it (a stage
ledger's claim records its holder's job, so that a holder stalled recovery took back
loses its lease at once; its ``complete`` may save the job's success in the same
statement; ``queueing.ledger``).

The worker sets it around each job (``queueing.worker``); outside a job it is None.
A context variable: each job's thread (sync tasks) or task (async ones) sees its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class JobRun:
    """One run of a job on a pgstage worker: what saving its outcome is fenced on (the
    job is still ``doing`` under the worker's id at ``attempts``), whether a success
    deletes it, how soon a transaction that saved it must commit, and the worker's note
    that the run's code saved its success itself (in a transaction that committed), so
    the worker saves nothing after it."""

    job_id: int
    attempts: int
    #: The worker's id *now*: it changes when the worker registers again after its row
    #: was pruned (and takes its running jobs back under the new id), so a run reads it
    #: each time it fences a write, never once at its start.
    worker: Callable[[], int | None]
    delete_on_success: bool
    #: How long a transaction that saved the job's success may still idle before its
    #: COMMIT (the job's row is locked meanwhile): the worker's stall threshold.
    commit_within_seconds: float
    saved: Callable[[], None]

    @property
    def worker_id(self) -> int | None:
        """The worker's current id (see :attr:`worker`)."""
        return self.worker()


_job_id: ContextVar[int | None] = ContextVar("pgstage_current_job_id", default=None)
_run: ContextVar[JobRun | None] = ContextVar("pgstage_current_job_run", default=None)


def job_id() -> int | None:
    """The procrastinate job id this code runs in, or None outside a job."""
    return _job_id.get()


def run() -> JobRun | None:
    """The run this code is, when a pgstage worker runs it; else None."""
    return _run.get()


@contextmanager
def running(job_id: int | None, *, run: JobRun | None = None) -> Iterator[None]:
    """Mark the block as running job ``job_id`` (the worker's job middleware, which also
    passes the ``run``)."""
    token = _job_id.set(job_id)
    run_token = _run.set(run)
    try:
        yield
    finally:
        _run.reset(run_token)
        _job_id.reset(token)
