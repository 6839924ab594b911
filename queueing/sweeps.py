"""Sweeps: periodic, never stacked, safe beside themselves during overlapping deploys.

Declare a sweep once::

    @declare_sweep(name="unsaved_runs", cron="* * * * * */30", batch_size=100,
                   grace_setting="SWEEP_GRACE_SECONDS")
    def sweep_unsaved_runs(ctx: SweepContext) -> SweepResult: ...

and get:

* a periodic *tick* task that only enqueues the sweep as its own job, so a slow sweep
  never blocks the tick (or the other periodic work);
* the sweep job, enqueued with the singleton key ``sweep:<name>`` under the ``EXCLUSIVE``
  policy: never more than one waiting or running per sweep, across every worker and host;
* ``manage.py sweep NAME|--all [--dry-run]`` to run it once by hand.

A sweep job whose worker dies keeps its key in ``doing``, so every later tick deduplicates
onto it until stalled recovery frees it (procrastinate #1408). Recovery itself therefore
must not be such a job: ``inline=True`` sweeps (stalled recovery) are no jobs at all. Every
worker runs them in its own maintenance loop every ``every_seconds`` (``queueing.worker``),
inside one transaction under a transaction-level try-lock ``queueing_sweep:<name>``: two
runs never overlap (the second skips), a run that dies takes its lock with it (its
connection closes and PostgreSQL ends the transaction), and no backlog of jobs delays it.
Each run records itself in ``pgstage_inline_sweeps``; after a gap longer than the sweep's
grace less one and a half heartbeats (the database, or every worker, was away:
``Sweep.resume_gap_seconds``) it records that it *resumed*, and hands that moment to the
sweep (``Watch.resumed_at``): stalled recovery counts a worker's silence from it,
since nobody could beat during the gap, nor could recovery watch. That try-lock and clock
are one function, :func:`watch`, and every way into an inline sweep goes through it: the
workers' maintenance loop, ``manage.py sweep`` (:func:`run_sweep`), the admin and an
operator's retry of a stalled job (``queueing.jobs.job_retry``).

Inside, :func:`sweep_rows` selects a bounded batch ``FOR UPDATE … SKIP LOCKED`` (two
sweeps on two hosts take disjoint rows), oldest first as the query orders it, and runs
each row in its own savepoint so one failing row does not stop the batch. The work per
row must re-check state (compare-and-set) in its UPDATE. A sweep job is a normal running
job, so a worker's SIGTERM drains it: it finishes the batch it holds.

Every sweep transaction is bounded (``SET LOCAL statement_timeout`` and
``idle_in_transaction_session_timeout``, ``QUEUEING_SWEEP_TRANSACTION_TIMEOUT_SECONDS``):
when a worker's host vanishes mid-sweep, PostgreSQL ends the orphaned transaction after
that long instead of when TCP gives up (hours), so its row locks and try-lock come free.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from queueing import locks
from queueing.app import periodic, task
from queueing.cron import describe_cron
from queueing.enqueue import Enqueued, Policy, enqueue
from queueing.exceptions import UnknownSweep
from queueing.keys import KeyFormat
from queueing.outage import beat_resume_seconds
from queueing.sql import queries

__all__ = [
    "SweepContext",
    "SweepResult",
    "Watch",
    "declare_sweep",
    "get_sweep",
    "request_sweep",
    "run_sweep",
    "sweep_rows",
    "sweeps",
    "watch",
]

logger = logging.getLogger(__name__)

SWEEP_KEY = KeyFormat(prefix="sweep", parts=("name",))
SWEEP_QUEUE = "sweeps"
#: The try-lock an inline sweep's tick runs under.
SWEEP_LOCK = locks.namespace("queueing_sweep")


@dataclass(frozen=True, kw_only=True)
class SweepResult:
    """Counts of one sweep run: rows selected, changed, failed (isolated errors)."""

    selected: int = 0
    changed: int = 0
    failed: int = 0
    notes: Mapping[str, int] = field(default_factory=dict)

    def __add__(self, other: SweepResult) -> SweepResult:
        notes = dict(self.notes)
        for k, v in other.notes.items():
            notes[k] = notes.get(k, 0) + v
        return SweepResult(
            selected=self.selected + other.selected,
            changed=self.changed + other.changed,
            failed=self.failed + other.failed,
            notes=notes,
        )


@dataclass(frozen=True, kw_only=True)
class Watch:
    """An inline sweep's clock, read and moved by :func:`watch` under the sweep's
    try-lock: when its runs last resumed after a gap (a live worker's silence counts from
    then), whether this run is that resumption, and how long nobody had watched before
    it (None for the first run ever)."""

    resumed_at: datetime.datetime
    resumed_now: bool
    unwatched_seconds: float | None


@dataclass(frozen=True, kw_only=True)
class SweepContext:
    name: str
    batch_size: int
    grace_seconds: int
    dry_run: bool = False
    #: An inline sweep's clock (:func:`watch`); None for a job sweep.
    watch: Watch | None = None


@dataclass(frozen=True, kw_only=True)
class Sweep:
    name: str
    func: Callable[[SweepContext], SweepResult]
    cron: str
    batch_size: int
    grace_setting: str | None
    grace_default: int
    description: str
    inline: bool = False
    every_setting: str | None = None
    every_default: float = 0.0

    @property
    def every_seconds(self) -> float:
        """An inline sweep's period (each worker runs it this often)."""
        if self.every_setting is None:
            return self.every_default
        return float(getattr(settings, self.every_setting, self.every_default))

    @property
    def schedule(self) -> str:
        """The cadence in words (``every 30 seconds``; :func:`queueing.cron.describe_cron`)."""
        if self.inline:
            unit = "second" if self.every_seconds == 1 else "seconds"
            return f"every {self.every_seconds:g} {unit}, in every worker"
        return describe_cron(self.cron)

    @property
    def grace_seconds(self) -> int:
        if self.grace_setting is None:
            return self.grace_default
        return int(getattr(settings, self.grace_setting, self.grace_default))

    @property
    def resume_gap_seconds(self) -> float:
        """An inline sweep *resumes* (``Watch.resumed_at``) when its previous run is
        older than this: the grace less one and a half heartbeats, less the liveness
        bound. A live worker's last beat is at most one heartbeat (and a late beat's half)
        older than the moment the database (or every worker) went away, and its next beat
        lands at most ``beat_resume_seconds`` after the database is back; so an unwatched
        gap any shorter, plus both, stays within the grace: no live worker is ever taken
        for dead across a gap. After a longer one, silence counts from the resumption, and
        the grace (at least two heartbeats, ``queueing.W001``) covers the bound. System
        check ``queueing.E003`` keeps the period at most half of it, so runs that follow
        each other (a slow run included) never count as a gap."""
        return resume_gap_seconds(
            grace=self.grace_seconds,
            heartbeat=float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10)),
        )

    @property
    def task_name(self) -> str:
        return f"queueing.sweep.{self.name}"

    @property
    def tick_name(self) -> str:
        return f"queueing.sweep_tick.{self.name}"

    def context(
        self,
        *,
        dry_run: bool = False,
        batch_size: int | None = None,
        watch: Watch | None = None,
    ) -> SweepContext:
        return SweepContext(
            name=self.name,
            batch_size=batch_size or self.batch_size,
            grace_seconds=self.grace_seconds,
            dry_run=dry_run,
            watch=watch,
        )


def resume_gap_seconds(*, grace: float, heartbeat: float) -> float:
    """See :attr:`Sweep.resume_gap_seconds` (and system check ``queueing.E003``)."""
    return grace - 1.5 * heartbeat - beat_resume_seconds(heartbeat)


_registry: dict[str, Sweep] = {}
#: What :func:`declare_sweep` registers: one run of the sweep.
SweepFunction = Callable[[SweepContext], SweepResult]


def declare_sweep(
    *,
    name: str,
    cron: str = "",
    batch_size: int = 100,
    grace_setting: str | None = None,
    grace_default: int = 0,
    inline: bool = False,
    every_setting: str | None = None,
    every_default: float = 0.0,
) -> Callable[[SweepFunction], SweepFunction]:
    """Register ``func(ctx) -> SweepResult`` as a sweep with a periodic tick (``cron``)
    and a singleton job; or, ``inline=True``, as one every worker runs itself every
    ``every_*`` seconds under the sweep's try-lock."""
    SWEEP_KEY.build(name=name)  # validates the name
    if inline == bool(cron):
        raise ValueError(f"sweep {name!r}: give a cron, or inline=True with a period")

    def decorator(func: SweepFunction) -> SweepFunction:
        if name in _registry:
            raise ValueError(f"sweep {name!r} is declared twice")
        sweep = Sweep(
            name=name,
            func=func,
            cron=cron,
            batch_size=batch_size,
            grace_setting=grace_setting,
            grace_default=grace_default,
            # The docstring's first paragraph, however many lines it wraps over.
            description=" ".join((func.__doc__ or "").strip().split("\n\n")[0].split()),
            inline=inline,
            every_setting=every_setting,
            every_default=every_default,
        )
        _registry[name] = sweep

        if inline:
            # Not periodic: workers run it in their maintenance loop. The task lets
            # code ask any worker for one run now (request_sweep), through run_sweep's
            # try-lock and clock like every other run.
            @task(name=sweep.tick_name, queue=SWEEP_QUEUE, retry=False, cancellable=True)
            def inline_tick(timestamp: int = 0) -> dict[str, Any] | None:
                result = run_sweep(name)
                return None if result is None else _counts(result)

            return func

        # A cancelled sweep job or tick loses nothing: the next tick asks again.
        @task(name=sweep.task_name, queue=SWEEP_QUEUE, retry=False, cancellable=True)
        def run_job() -> dict[str, Any]:
            result = run_sweep(name)
            assert result is not None  # only an inline sweep is ever skipped
            return _counts(result)

        @periodic(cron=cron, periodic_id=name)
        @task(name=sweep.tick_name, queue=SWEEP_QUEUE, retry=False, cancellable=True)
        def tick(timestamp: int) -> int:
            return request_sweep(name).job_id

        return func

    return decorator


def sweeps() -> Mapping[str, Sweep]:
    return dict(sorted(_registry.items()))


def get_sweep(name: str) -> Sweep:
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "none"
        raise UnknownSweep(f"no sweep named {name!r} (known: {known})") from None


def _counts(result: SweepResult) -> dict[str, Any]:
    return {"selected": result.selected, "changed": result.changed, "failed": result.failed}


def request_sweep(name: str) -> Enqueued:
    """Enqueue the sweep's job unless one is already waiting or running (EXCLUSIVE). For
    an inline sweep, enqueue a tick instead, unless one is already waiting (SHORT: a dead
    tick in ``doing`` never blocks the next)."""
    sweep = get_sweep(name)
    key = SWEEP_KEY.build(name=name)
    if sweep.inline:
        return enqueue(sweep.tick_name, args={"timestamp": 0}, key=key, policy=Policy.SHORT)
    return enqueue(sweep.task_name, key=key, policy=Policy.EXCLUSIVE)


def bound_transaction(*, using: str = "default") -> None:
    """Bound the current transaction: no statement runs longer, and no pause between
    statements lasts longer, than ``QUEUEING_SWEEP_TRANSACTION_TIMEOUT_SECONDS``; past
    either PostgreSQL ends it (and the session, for the pause), releasing its locks."""
    milliseconds = int(
        float(getattr(settings, "QUEUEING_SWEEP_TRANSACTION_TIMEOUT_SECONDS", 60)) * 1000
    )
    with connections[using].cursor() as cursor:
        cursor.execute(queries["bound_transaction"], {"ms": str(milliseconds)})


@contextlib.contextmanager
def watch(name: str) -> Iterator[Watch | None]:
    """The one way into an inline sweep's work (stalled recovery): a bounded transaction
    under the sweep's try-lock that records this run on its clock
    (``pgstage_inline_sweeps``) and yields the :class:`Watch`; None when another run holds
    the lock (it is doing this work right now). The worker's maintenance loop,
    ``manage.py sweep``, the admin and an operator's retry of a stalled job all come
    through here, so none of them can take a live worker's job across a gap that the
    others have seen (``Sweep.resume_gap_seconds``)."""
    sweep = get_sweep(name)
    if not sweep.inline:
        raise ValueError(f"sweep {name!r} is not inline: it has no recovery clock")
    with transaction.atomic():
        bound_transaction()
        if not locks.try_xact_lock(SWEEP_LOCK, name):
            logger.info("sweep %s: another run holds its lock; skipped", name)
            yield None
            return
        with connections["default"].cursor() as cursor:
            cursor.execute(
                queries["inline_sweep_clock"], {"name": name, "gap": sweep.resume_gap_seconds}
            )
            resumed_at, resumed_now, unwatched = cursor.fetchone()
        if resumed_now:
            logger.info(
                "sweep %s resumed after more than %.1f s without a run (the database, or "
                "every worker, was away): silence counts from now",
                name,
                sweep.resume_gap_seconds,
            )
        yield Watch(
            resumed_at=resumed_at,
            resumed_now=resumed_now,
            unwatched_seconds=None if unwatched is None else float(unwatched),
        )


def run_sweep(
    name: str,
    *,
    dry_run: bool = False,
    batch_size: int | None = None,
) -> SweepResult | None:
    """Run one sweep once, in this process. An inline sweep (stalled recovery) runs
    through :func:`watch` — its try-lock and clock — whoever calls: None when another run
    holds its lock. A job sweep runs as is (its rows are taken ``FOR UPDATE SKIP
    LOCKED`` and re-checked in every write), so it never returns None."""
    sweep = get_sweep(name)
    if sweep.inline:
        with watch(name) as clock:
            if clock is None:
                return None
            result = sweep.func(sweep.context(dry_run=dry_run, batch_size=batch_size, watch=clock))
    else:
        result = sweep.func(sweep.context(dry_run=dry_run, batch_size=batch_size))
    if result.selected or result.failed:
        logger.info(
            "sweep %s: selected=%d changed=%d failed=%d%s",
            name,
            result.selected,
            result.changed,
            result.failed,
            " (dry run)" if dry_run else "",
        )
    return result


def sweep_rows(
    ctx: SweepContext,
    *,
    select_sql: str,
    params: Mapping[str, Any],
    process: Callable[[Sequence[Any]], bool | str],
    using: str = "default",
    commit_each: bool = False,
) -> SweepResult:
    """Select a batch (``select_sql`` must end ``FOR UPDATE … SKIP LOCKED``) and process
    each row in its own savepoint; the row locks are held until the batch commits.

    ``process(row)`` returns True (changed), False (nothing to do: a re-check failed) or a
    note name to count. An exception in one row is logged and counted as failed.

    ``commit_each``: each row is processed in a bounded transaction of its own, after
    the select's has committed (its row locks are gone, so ``process`` locks and
    re-checks its row itself). For processing that takes locks of more than one key —
    a row's user and the tenant's budget, say — which other paths take in their own
    order: in one batch, the locks of the rows done would be held while the next row's
    are taken, and that would deadlock with a path that holds the next row's key and
    wants one of them. Only outside a transaction does each row commit: inside the
    caller's, each is a savepoint of it.
    """
    outcomes: list[bool | str | None] = []
    with transaction.atomic(using=using):
        bound_transaction(using=using)
        with connections[using].cursor() as cursor:
            cursor.execute(select_sql, {**params, "limit": ctx.batch_size})
            rows = cursor.fetchall()
        if ctx.dry_run:
            return SweepResult(selected=len(rows))
        if not commit_each:
            outcomes = [_process_row(ctx, process, row, using=using) for row in rows]
    if commit_each:
        for row in rows:
            with transaction.atomic(using=using):
                bound_transaction(using=using)
                outcomes.append(_process_row(ctx, process, row, using=using))
    notes: dict[str, int] = {}
    for outcome in outcomes:
        if isinstance(outcome, str):
            notes[outcome] = notes.get(outcome, 0) + 1
    return SweepResult(
        selected=len(rows),
        changed=sum(outcome is True for outcome in outcomes),
        failed=sum(outcome is None for outcome in outcomes),
        notes=notes,
    )


def _process_row(
    ctx: SweepContext,
    process: Callable[[Sequence[Any]], bool | str],
    row: Sequence[Any],
    *,
    using: str,
) -> bool | str | None:
    """``process(row)`` in a savepoint: its outcome, or None when it raised (logged)."""
    try:
        with transaction.atomic(using=using):
            return process(row)
    except Exception:
        logger.exception("sweep %s: row %r failed; the batch goes on", ctx.name, row[0])
        return None
