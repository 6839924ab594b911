"""The stage ledger: each stage of a unit of work succeeds at most once.

A concrete ledger is a model that subclasses :class:`LedgerEntry` and adds its key
columns with a unique constraint over them (e.g. ``(tenant_id, anfrage_id, stage)``);
:class:`Ledger` runs the claim protocol on it:

* ``claim`` is one ``INSERT … ON CONFLICT … DO UPDATE … WHERE`` (no SELECT-then-INSERT):
  *claimed* (with a fencing token, the attempt number), *done* (already ``success``: skip)
  or *busy* (a live holder has it: poll again soon, never skip —
  :class:`~queueing.exceptions.PollLater`, which is no attempt).
* ``complete`` and ``fail`` are compare-and-set on the token, so a worker whose lease
  expired cannot overwrite its successor's row. ``hold`` share-locks the row the work
  builds on (:class:`Prerequisite`: e.g. the stage before) and requires it to be
  ``success`` with the token seen before the work read its input.

A holder is live while its lease runs **and**, when it claimed inside a job (the claim
records it: ``holder_job_id``, from ``queueing.current``), while that job is ``doing``.
A worker that dies holding a stage is declared dead by stalled recovery, which takes its
job back; from then on its lease is dead too, so the stage is taken over within the stall
threshold (plus one recovery period and one poll), not at the lease's end: by the job's
own new run at once, by any other claimer on its next poll. A claim made outside a job
(a command, a test) is held by its lease alone.

``claim`` must commit before the work starts (call it outside ``atomic()``), so that its
lease is visible to other workers. Work that may outlast the lease runs inside
``with ledger.renewing(claim):``: a background thread extends the lease every third of
it (compare-and-set on the token), so a live holder is never taken over, while a dead
one's lease still runs out.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db import DatabaseError, connections, models, transaction
from django.db.transaction import TransactionManagementError

from queueing import current, sql
from queueing.exceptions import LeaseLost, PrerequisiteChanged
from queueing.rows import concrete_field

__all__ = ["Claim", "Ledger", "LedgerEntry", "LedgerStatus", "Outcome", "Prerequisite"]

logger = logging.getLogger(__name__)
_renew_queries = sql.load("queueing", "ledger.sql")


class LedgerStatus(models.TextChoices):
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"


class LedgerEntry(models.Model):
    """Abstract: the columns the claim protocol relies on."""

    status = models.CharField(max_length=16, choices=LedgerStatus.choices)
    attempts = models.PositiveIntegerField(default=0)
    input_hash = models.CharField(max_length=64, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    #: The procrastinate job that holds the claim (NULL: claimed outside a job).
    holder_job_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        abstract = True


class Outcome(enum.StrEnum):
    CLAIMED = "claimed"
    DONE = "done"
    BUSY = "busy"


@dataclass(frozen=True, kw_only=True)
class Claim:
    outcome: Outcome
    entry_id: int | None
    token: int | None

    @property
    def claimed(self) -> bool:
        return self.outcome is Outcome.CLAIMED


@dataclass(frozen=True, kw_only=True)
class Prerequisite:
    """The ledger row a claimed unit of work builds on, named by its key, and its token
    (``attempts``) as seen before the work read its input; ``None``: it was not
    ``success`` then. Every run of the prerequisite moves its token (a claim counts an
    attempt), so an unchanged token on a ``success`` row means its output is the one the
    work read."""

    key: dict[str, Any]
    token: int | None


class LeaseRenewal:
    """The live handle of :meth:`Ledger.renewing`: how many renewals landed, and whether
    the token went stale (``lost``; the holder's ``complete``/``fail`` then raise
    :class:`LeaseLost`, as without renewal)."""

    def __init__(self) -> None:
        self.renewals = 0
        self.lost = threading.Event()


@dataclass(eq=False)
class _Pending:
    start: Callable[[], threading.Thread]
    cancelled: bool = False
    thread: threading.Thread | None = None


#: Ended blocks left in the starter's heap beyond which it is rebuilt without them.
_COMPACT_AT = 64


def _never_started() -> threading.Thread:
    raise AssertionError("a cancelled renewal is never started")


class _Starter:
    """One daemon thread per process that starts each renewal thread when its first
    tick is due, unless the block ended before (:meth:`cancel`)."""

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._due: list[tuple[float, int, _Pending]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        #: Entries in the heap cancelled before their start (popped or compacted away).
        self._cancelled = 0

    def schedule(self, due: float, start: Callable[[], threading.Thread]) -> _Pending:
        pending = _Pending(start=start)
        with self._ready:
            heapq.heappush(self._due, (due, next(self._order), pending))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="lease-renewal-starter", daemon=True
                )
                self._thread.start()
            self._ready.notify()
        return pending

    def cancel(self, pending: _Pending) -> threading.Thread | None:
        """No start from now on; the renewal thread if it was started already.

        An entry not started yet stays in the heap until it comes to the top, but without
        its start (which holds the claim and the block's state), and once most entries are
        such leftovers (blocks that ended behind a longer one) the heap is rebuilt without
        them: a busy worker's ended blocks do not pile up for a third of a lease."""
        with self._ready:
            if not pending.cancelled and pending.thread is None:
                pending.start = _never_started
                self._cancelled += 1
                if self._cancelled > _COMPACT_AT and self._cancelled * 2 > len(self._due):
                    self._due = [entry for entry in self._due if not entry[2].cancelled]
                    heapq.heapify(self._due)
                    self._cancelled = 0
            pending.cancelled = True
            return pending.thread

    def _run(self) -> None:
        with self._ready:
            while True:
                while self._due and self._due[0][2].cancelled:
                    heapq.heappop(self._due)
                    self._cancelled = max(0, self._cancelled - 1)
                if not self._due:
                    self._ready.wait()
                    continue
                wait = self._due[0][0] - time.monotonic()
                if wait > 0:
                    self._ready.wait(wait)
                    continue
                _, _, pending = heapq.heappop(self._due)
                try:
                    pending.thread = pending.start()
                except Exception:  # a thread that cannot start must not stop the starter
                    logger.exception("a lease renewal thread could not be started")


_STARTER = _Starter()

#: ``ledger_complete``'s parameters when it enqueues nothing and finishes no job.
_NO_JOB: dict[str, Any] = {
    "queue": None,
    "task_name": None,
    "priority": None,
    "queueing_lock": None,
    "args": None,
    "scheduled_at": None,
    "finish": False,
    "job_id": None,
    "worker_id": None,
    "attempts": None,
    "delete_job": False,
    "idle_ms": "0",
}


@dataclass(frozen=True)
class Ledger:
    """The claim protocol over ``model``, keyed by ``key_fields`` (its unique columns)."""

    model: type[LedgerEntry]
    key_fields: tuple[str, ...]
    lease_seconds: float = 300.0
    using: str = "default"

    @cached_property
    def _columns(self) -> tuple[str, ...]:
        return tuple(concrete_field(self.model, f).column for f in self.key_fields)

    @cached_property
    def _statements(self) -> dict[str, str]:
        names = tuple(f"key_{i}" for i in range(len(self._columns)))
        table = self.model._meta.db_table
        return {
            "claim": sql.render(
                sql.queries["ledger_claim"],
                table=table,
                keys=self._columns,
                values=sql.placeholders(names),
            ),
            "complete": sql.render(sql.queries["ledger_complete"], table=table),
            "prerequisite": sql.render(
                sql.queries["ledger_prerequisite"],
                table=table,
                keys=self._columns,
                values=sql.placeholders(names),
            ),
            "fail": sql.render(sql.queries["ledger_fail"], table=table),
            "renew": sql.render(_renew_queries["ledger_renew"], table=table),
        }

    def claim(
        self,
        *,
        input_hash: str = "",
        lease_seconds: float | None = None,
        also: Callable[[], None] | None = None,
        **key: Any,
    ) -> Claim:
        """Claim the stage named by ``key`` in one statement. Race-free: of any number of
        concurrent claimers exactly one gets *claimed*; the others see *busy* or *done*.
        Inside a job, the claim records the job as its holder (see the module
        docstring). A pgstage worker's run claims only while its job is still that run
        (``doing`` under its worker, at its attempt): a run whose job was taken back
        (stalled recovery, a timeout, a fetch lost with a crashed server) before the
        claim's snapshot raises :class:`LeaseLost` and claims nothing. One taken back
        after it (while the claim runs, or while its work runs) holds a claim that the
        job's next run takes over at once: its ``complete`` saves the unit of work only
        until the next run has claimed it (then it raises :class:`LeaseLost`), and never
        saves the job's success (``finish_job``), which is the next run's.

        ``also`` sends statements that follow the claim in its round trip (a psycopg
        pipeline; one statement per execute, on cursors it keeps): what the work reads
        only once it holds the claim. It must read no result itself; its caller reads
        them after ``claim`` returns, whatever the outcome, or closes them when ``claim``
        raises. ``also`` may be called twice: a claim refused because its prepared plan
        went stale is sent again, with what ``also`` sends. Outside a transaction the
        claim and those statements are one transaction of their own (``BEGIN`` and
        ``COMMIT`` in the same round trip): a statement of ``also`` that fails, a Python
        error or an interrupt in ``also``, or a constraint that fails at the commit rolls
        the claim back with them, and raises.

        Each statement of ``also`` runs on a snapshot taken after the claim under READ
        COMMITTED, PostgreSQL's default, which the ledger assumes: it sees what the claim
        saw and what committed while the claim waited for a lock. Under REPEATABLE READ
        it would see the transaction's first snapshot, taken before that wait."""
        missing = set(self.key_fields) ^ set(key)
        if missing:
            raise TypeError(f"claim() needs exactly the key fields {self.key_fields}")
        params: dict[str, Any] = {f"key_{i}": key[f] for i, f in enumerate(self.key_fields)}
        params["input_hash"] = input_hash
        params["lease_seconds"] = self.lease_seconds if lease_seconds is None else lease_seconds
        params["job_id"] = current.job_id()
        run = current.run()
        params["run_worker_id"] = run.worker_id if run is not None else None
        if run is not None and params["run_worker_id"] is None:
            raise LeaseLost(
                f"job {run.job_id}: this run's worker has no id (it never registered, or "
                "stopped): it claims nothing"
            )
        params["run_attempts"] = run.attempts if run is not None else None
        if also is None:
            with sql.statement_cursor(connections[self.using]) as cursor:
                cursor.execute(self._statements["claim"], params)
                row = cursor.fetchone()
        else:
            row = self._claim_with(params, also)
        if row is None:
            return Claim(outcome=Outcome.BUSY, entry_id=None, token=None)
        outcome, entry_id, attempts = row
        if outcome == "gone":
            assert run is not None
            raise LeaseLost(
                f"job {run.job_id}: this run (attempt {run.attempts + 1}) is no longer its job's "
                "run (taken back by recovery, or its fetch lost with the database): it claims "
                "nothing, and the job's next run does the work"
            )
        outcome = Outcome(outcome)
        return Claim(
            outcome=outcome,
            entry_id=entry_id,
            token=attempts if outcome is Outcome.CLAIMED else None,
        )

    def complete(
        self,
        claim: Claim,
        *,
        then: dict[str, Any] | None = None,
        finish_job: bool = False,
        hold: Prerequisite | None = None,
        write: Callable[[], Callable[[], None] | None] | None = None,
    ) -> None:
        """Mark the claimed stage ``success``; raises :class:`LeaseLost` when another
        worker re-claimed it meanwhile (so the caller's transaction rolls back).

        ``then`` (``queueing.enqueue.job_params(...)``) enqueues the next job in the same
        statement, only when the row was closed: one round trip for both. A job already
        holding its key is left as it is, as ``enqueue`` would deduplicate.

        ``finish_job=True`` says this complete is the last thing the job does: on a pgstage
        worker, the same statement also saves the job ``succeeded`` (fenced as the worker's
        own save: only while the job is still this run's), and once the caller's
        transaction commits the worker saves nothing more — one round trip and one commit
        fewer per job. The job's row stays locked until that commit, so the rest of the
        transaction may idle no longer than the worker's stall threshold (a vanished
        worker's session is then ended, and its job recovered as any stalled job). Should
        the task raise after that commit, the saved success stands (the worker says so).
        Outside a pgstage worker's job it changes nothing.

        ``hold`` and ``write`` make it the work's whole closing transaction in one round
        trip (call it inside ``transaction.atomic()``, first in it; the caller commits):
        the transaction's BEGIN, the :meth:`hold` of ``hold``, the statements ``write()``
        executes and the completion are sent together (``queueing.sql.pipelined``), and
        their results are read when they are back: the hold's first
        (:class:`PrerequisiteChanged`, also when a later statement failed), then the
        callable ``write()`` returned, if any (it may read its statements' results and
        run more), then the completion's (:class:`LeaseLost`). ``write`` must read no
        result itself (each read waits for the round trip); everything it sent is rolled
        back with the caller's transaction when a check raises: a failed check marks it
        for rollback (Django's ``set_rollback``), so leave the ``atomic()`` block with the
        error (a query inside it raises ``TransactionManagementError``). ``write`` sends
        one statement per execute (a pipeline takes no string of several)."""
        params, run = self._complete_params(then=then, finish_job=finish_job)
        if hold is None and write is None:
            self._completed(self._close("complete", claim, params), run)
            return
        if not claim.claimed:
            raise LeaseLost(f"cannot complete a claim that is {claim.outcome}")
        hold_params = self._hold_params(hold) if hold is not None else None
        self._require_transaction("complete(hold=..., write=...)")
        held = closing = None
        try:
            try:
                with sql.pipelined(connections[self.using]):
                    if hold_params is not None:
                        held = self._send("prerequisite", hold_params)
                    after = write() if write is not None else None
                    closing = self._send(
                        "complete", {"id": claim.entry_id, "token": claim.token, **params}
                    )
            except Exception:
                if held is not None:
                    assert hold is not None
                    # The hold's verdict first: a later statement may have failed because
                    # the stage before changed under it.
                    self._raise_if_changed(hold, held)
                raise
            if held is not None:
                assert hold is not None
                self._check_held(hold, self._fetch(held))
            if after is not None:
                after()
            assert closing is not None
            self._completed(self._closed(claim, self._fetch(closing)), run)
        except BaseException:
            # What was sent ran on the server (the completion too): it must not commit,
            # even for a caller that catches the error inside its atomic() block.
            transaction.set_rollback(True, using=self.using)
            for cursor in (held, closing):
                if cursor is not None:
                    cursor.close()
            raise

    def _complete_params(
        self, *, then: dict[str, Any] | None, finish_job: bool
    ) -> tuple[dict[str, Any], current.JobRun | None]:
        run = current.run() if finish_job else None
        params: dict[str, Any] = {**_NO_JOB, **(then or {}), "enqueue": then is not None}
        worker_id = run.worker_id if run is not None else None
        if run is not None and worker_id is not None:
            params.update(
                finish=True,
                job_id=run.job_id,
                worker_id=worker_id,
                attempts=run.attempts,
                delete_job=run.delete_on_success,
                idle_ms=str(max(1, round(run.commit_within_seconds * 1000))),
            )
        return params, run

    def _completed(self, row: tuple[Any, ...], run: current.JobRun | None) -> None:
        if row[2]:
            assert run is not None
            transaction.on_commit(run.saved, using=self.using)

    def hold(self, prerequisite: Prerequisite) -> None:
        """In the caller's transaction, one statement: share-lock the row ``prerequisite``
        names (a reopening of it waits for the caller's transaction) and require it to be
        ``success`` with ``prerequisite.token``; else :class:`PrerequisiteChanged` says
        what it is now. Call it first in the transaction that writes the work's results
        (outside one it raises ``TransactionManagementError``); ``complete(hold=...)``
        sends it with the results and the completion in one round trip."""
        params = self._hold_params(prerequisite)
        self._require_transaction("hold()")
        self._check_held(prerequisite, self._fetch(self._send("prerequisite", params)))

    def _hold_params(self, prerequisite: Prerequisite) -> dict[str, Any]:
        missing = set(self.key_fields) ^ set(prerequisite.key)
        if missing:
            raise TypeError(f"a prerequisite needs exactly the key fields {self.key_fields}")
        return {f"key_{i}": prerequisite.key[f] for i, f in enumerate(self.key_fields)}

    def _require_transaction(self, what: str) -> None:
        if not connections[self.using].in_atomic_block:
            # In autocommit the share lock ends with the statement: the check would vouch
            # for nothing the caller writes afterwards.
            raise TransactionManagementError(
                f"{what} share-locks the prerequisite for the caller's transaction: "
                "call it inside transaction.atomic()"
            )

    @staticmethod
    def _check_held(prerequisite: Prerequisite, row: tuple[Any, ...] | None) -> None:
        status, token = row if row is not None else (None, None)
        if status != LedgerStatus.SUCCESS or token != prerequisite.token:
            raise PrerequisiteChanged(status=status, token=token)

    def _raise_if_changed(self, prerequisite: Prerequisite, cursor: Any) -> None:
        """After a failed round trip: the hold's :class:`PrerequisiteChanged`, if its row
        came back and says so; nothing if it did not come back."""
        try:
            row = self._fetch(cursor)
        except Exception:
            return
        self._check_held(prerequisite, row)

    def fail(self, claim: Claim, *, error: str) -> None:
        """Mark the claimed stage ``failed`` with ``error``; it stays claimable. Raises
        :class:`LeaseLost` when another worker re-claimed it meanwhile."""
        self._close("fail", claim, {"error": error[:10_000]})

    def renew(self, claim: Claim, *, lease_seconds: float | None = None) -> bool:
        """Extend the claim's lease to now + ``lease_seconds``; one compare-and-set on the
        token. False when the token is stale: a successor's lease is never extended."""
        if not claim.claimed:
            return False
        with connections[self.using].cursor() as cursor:
            cursor.execute(
                self._statements["renew"],
                {
                    "id": claim.entry_id,
                    "token": claim.token,
                    "lease_seconds": self.lease_seconds if lease_seconds is None else lease_seconds,
                },
            )
            return cursor.fetchone() is not None

    @contextmanager
    def renewing(
        self, claim: Claim, *, lease_seconds: float | None = None, every: float | None = None
    ) -> Iterator[LeaseRenewal]:
        """Keep the claim's lease alive while the block runs (call it outside ``atomic()``).

        A background thread with its own connection (closed when the block ends) calls
        :meth:`renew` every ``every`` seconds (a third of the lease by default). When the
        token went stale it stops and sets ``lost``. A failed renewal (the database briefly
        unreachable) is logged and tried again at the next tick. The block's exit waits for
        a renewal in flight, so none runs beside the caller's closing transaction.

        The thread is started at the first tick (by one process-wide starter thread): a
        block that ends sooner, as most do, costs no thread of its own.
        """
        lease = self.lease_seconds if lease_seconds is None else lease_seconds
        tick = lease / 3 if every is None else every
        renewal = LeaseRenewal()
        stop = threading.Event()

        def start() -> threading.Thread:
            thread = threading.Thread(
                target=self._renew_until,
                args=(claim, lease, tick, stop, renewal),
                name=f"lease-renewal-{self.model.__name__}-{claim.entry_id}",
                daemon=True,
            )
            thread.start()
            return thread

        pending = _STARTER.schedule(time.monotonic() + tick, start)
        try:
            yield renewal
        finally:
            stop.set()
            thread = _STARTER.cancel(pending)
            if thread is not None:
                thread.join()

    def _renew_until(
        self,
        claim: Claim,
        lease: float,
        every: float,
        stop: threading.Event,
        renewal: LeaseRenewal,
    ) -> None:
        # Started at the first tick: the first renewal is due at once.
        delay = 0.0
        try:
            while not stop.wait(delay):
                delay = every
                try:
                    renewed = self.renew(claim, lease_seconds=lease)
                except DatabaseError:
                    logger.warning(
                        "%s %s: lease renewal failed; trying again in %.0f s",
                        self.model.__name__,
                        claim.entry_id,
                        every,
                        exc_info=True,
                    )
                    connections[self.using].close()
                    continue
                if not renewed:
                    logger.warning(
                        "%s %s: token %s is stale; the lease was taken over",
                        self.model.__name__,
                        claim.entry_id,
                        claim.token,
                    )
                    renewal.lost.set()
                    return
                renewal.renewals += 1
        finally:
            connections[self.using].close()

    def _close(self, statement: str, claim: Claim, extra: dict[str, Any]) -> tuple[Any, ...]:
        if not claim.claimed:
            raise LeaseLost(f"cannot {statement} a claim that is {claim.outcome}")
        cursor = self._send(statement, {"id": claim.entry_id, "token": claim.token, **extra})
        return self._closed(claim, self._fetch(cursor))

    def _closed(self, claim: Claim, row: tuple[Any, ...] | None) -> tuple[Any, ...]:
        if row is None:
            raise LeaseLost(f"{self.model.__name__} {claim.entry_id}: token {claim.token} is stale")
        return tuple(row)

    def _claim_with(self, params: dict[str, Any], also: Callable[[], None]) -> Any:
        """The claim and what ``also`` sends, in one pipeline; the claim's row. Refused
        because the claim's prepared plan went stale (a migration changed what it returns,
        a pooler's ``DISCARD ALL``), outside a transaction (where nothing ran), both are
        sent again, once, as a lone claim's statement cursor runs its statement again."""
        connection = connections[self.using]
        for attempt in (1, 2):
            sent = None
            try:
                with sql.pipelined(connection):
                    sent = self._send("claim", params)
                    also()
            except BaseException as exc:
                if sent is not None:
                    sent.close()
                raw = connection.connection
                if (
                    attempt == 1
                    and not connection.in_atomic_block
                    and raw is not None
                    and sql.may_replan(raw, exc)
                ):
                    sql.forget_prepared(raw)
                    continue
                raise
            return self._fetch(sent)
        raise AssertionError("unreachable")

    def _send(self, statement: str, params: dict[str, Any]) -> Any:
        """Execute one of the ledger's statements; the open cursor, to :meth:`_fetch`
        its row from (in a pipeline, once the pipeline has it)."""
        cursor = sql.statement_cursor(connections[self.using])
        try:
            cursor.execute(self._statements[statement], params)
        except BaseException:
            cursor.close()
            raise
        return cursor

    @staticmethod
    def _fetch(cursor: Any) -> tuple[Any, ...] | None:
        with cursor:
            return cursor.fetchone()
