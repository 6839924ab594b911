"""Tasks whose job's start needs no flush of its own: ``@task(claims_first=True)``.

A worker's fetch commits the job's start (``todo`` → ``doing``). PostgreSQL makes each
commit durable before it answers (``synchronous_commit``): it waits for the write-ahead
log to reach the disk, about 0.2 to 0.5 ms here, per commit. A stage job commits three
times — its fetch, its claim, its completion — and waits for three flushes.

A task declared ``claims_first=True`` promises that its first step is a transaction that
commits (a ledger claim) before it does anything outside the database. Its fetch then
commits without waiting for the flush (``synchronous_commit`` off for that one commit):
the claim's flush carries it, since the log reaches the disk in order (so the claim must
commit on the job table's server, with ``synchronous_commit`` not ``off``; ``on`` or
higher with a synchronous standby). What a crash of the server can lose is only a fetch
that no commit followed yet (a crash of PostgreSQL, before its WAL writer wrote the
commit out; of the machine, up to about three times ``wal_writer_delay`` after): the job
is then waiting again after the restart, as if it had never been fetched, and another
worker may take it. Its first run, should it go on, claims nothing: a worker's run claims
only while its job is still that run (``queueing.ledger``; else ``LeaseLost``), so the
stage runs under the job's live run alone. Every other task's fetch commits as the
database's setting says.

Keep ``claims_first`` off for a task that may act outside the database (call a provider,
send mail, write a file) before its first commit: a crash right after such a fetch would
run that action again at once, where with a flushed fetch the job would wait for stalled
recovery, or its worker's outcome, once the database is back. The worker's "Starting
job" log line and job record come before the claim: after a lost fetch they are there
twice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["check", "declare", "declared", "for_tasks"]

_claims_first: set[str] = set()


def check(task_name: str, claims_first: Any) -> None:
    """Raise TypeError on a ``claims_first`` that is not a bool."""
    if not isinstance(claims_first, bool):
        raise TypeError(f"task {task_name!r}: claims_first={claims_first!r} must be True or False")


def declare(task_name: str, claims_first: Any) -> None:
    """Record ``@task(claims_first=...)``. Raises TypeError on anything but a bool."""
    check(task_name, claims_first)
    if claims_first:
        _claims_first.add(task_name)
    else:
        _claims_first.discard(task_name)


def declared() -> frozenset[str]:
    """The task names declared ``claims_first=True``."""
    return frozenset(_claims_first)


def for_tasks(tasks: Mapping[str, Any]) -> tuple[str, ...]:
    """The names (aliases included) of ``tasks`` (procrastinate's name → task mapping)
    whose fetch needs no flush, as the fetch statement takes them."""
    return tuple(
        name for name, task in sorted(tasks.items()) if getattr(task, "name", name) in _claims_first
    )
