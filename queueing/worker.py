"""The pgstage worker: procrastinate's ``Worker``, hardened for the faults production meets.

``manage.py procrastinate worker`` runs it (``install`` is procrastinate's
``PROCRASTINATE_ON_APP_READY`` hook), so operators keep procrastinate's own command.

What it adds to procrastinate's worker (3.10):

* **A draining worker keeps heart-beating.** procrastinate cancels the heartbeat as soon as
  SIGTERM arrives, while its jobs run on (sync jobs to completion, whatever the graceful
  timeout); a stall threshold shorter than the drain then re-runs them on another worker.
  Here the heartbeat stops only after the last job has ended.
* **Stalled recovery runs beside the jobs, not among them.** Each worker runs the inline
  sweeps (stalled recovery) in a maintenance loop of its own, every period, under the
  sweep's try-lock: a backlog of jobs, or every slot busy with long ones, never delays
  the recovery of a dead worker's work.
* **It rides out the database going away** — terminated connections, a restart, a
  failover. procrastinate's worker exits on the first database error in any of its loops.
  Here each loop (fetch, heartbeat, LISTEN, periodic deferrer, maintenance, saving a job's
  outcome) retries with fully jittered backoff, capped at one second while the database is
  out of reach, and logs one line per attempt with its next delay (``queueing.outage``);
  any successful round trip ends a loop's failure streak. A loop that fails without a
  break for ``QUEUEING_DATABASE_OUTAGE_SECONDS`` stops the worker, which exits non-zero
  with a clear message for its supervisor — unless the database answered meanwhile (any
  loop's round trip within the window) or answers a round trip of the worker's own at
  that moment. A
  worker started while the database is away waits for it as long (procrastinate's pool
  opening gives up after 30 s: :class:`~queueing.outage.WorkerPool`). A database that
  refuses the worker (authentication failed, SQLSTATE 28P01/28000; no such database,
  3D000) is no outage: the worker exits at once, saying what to fix
  (:func:`~queueing.outage.refusal`).
* **Its liveness does not wait on procrastinate's pool.** The psycopg pool's reconnect
  delay doubles without a cap (1, 2, 4 … 128 s): after a one-minute outage a live worker
  would stay silent long after recovery resumed, and its job would run twice. The
  heartbeat beats on a connection of its own, tried again every second (or every
  heartbeat, when shorter) while the database is away, so a live worker beats again
  within one heartbeat interval of the database accepting connections (stalled recovery's
  wait after a gap relies on it). The pool gives up a lost connection after
  ``RECONNECT_SECONDS`` instead of retrying it on its doubling schedule, and as soon as
  the heartbeat or LISTEN gets through again it opens what it lacks at once: fetching,
  saving outcomes, defers from tasks and the periodic deferrer come back with it. LISTEN
  is established again on a fresh connection, followed by one poll at once, so jobs
  enqueued during the outage start within LISTEN latency and a second of the database's
  return.
* **A job's outcome is never dropped, and never written over another run.** Saving it is
  retried until the database is back, and fenced on the worker: a job that stalled
  recovery took back (this worker looked dead) is left to its new run; if this worker
  fetches that job again while its first run goes on, the second fetch is not run: the
  first run's outcome is saved on its row; when it was refused (saved while the job
  waited, before the second fetch took it), the job is put back once the first run has
  ended, and runs once more. A
  retry whose queueing lock a fresh job holds (procrastinate issues 1446/1543) ends
  ``failed`` as superseded instead of staying ``doing`` for ever.
* **A fetch whose reply was lost** (the connection cut after the fetch committed) would
  leave a job ``doing`` under this live worker that never runs it; after a failed fetch
  the worker puts such jobs back, one by one (superseded or aborted ones end); it looks
  again before a fetch a stall threshold after its last look (a backlog included), and
  before the next fetch once a run it had fetched again has ended.
* **It fetches only with a recent beat.** A worker cut off (a partition, a dropped link)
  may get a fetch through its pool before its heartbeat beats again; the job would sit
  under a heartbeat past the stall threshold, and recovery would put it back while it
  runs, for a second worker to run it too. So a fetch waits until the last beat is
  recent enough (``fetch_beat_seconds``: the stall threshold less a heartbeat and the
  liveness bound), and the worker says so once; and the fetch statement judges the same
  on the server when it runs (a fetch held on the way arrives late), taking nothing past
  it.
* **Its row survives an outage.** Only workers silent far longer than any live one can be
  are pruned, and a worker whose row went missing registers again and takes its running
  jobs back, in one statement.
* **It fetches only jobs of its own tasks** (:class:`TaskNameJobManager`): procrastinate's
  worker fetches any job of its queues and fails one of a task it lacks for good
  (``TaskNotFound``), e.g. a newer release's job during a rolling deploy. Here that job
  waits for a worker that has the task, and each worker says so once per task name.
* **Jobs that fail for good settle their domain.** The statement that saves a job's last
  attempt as ``failed`` (or the job aborted) records that it owes its task's
  ``on_give_up`` hook; the hook runs right after, and if this worker dies first, the next
  maintenance run of a worker that has the hook runs it (``queueing.giveup``): a domain
  row never stays active behind a failed job.
* **Waiting on a busy holder is no attempt.** A task that raises
  :class:`~queueing.exceptions.PollLater` (a stage ledger's *busy*) is put back to wait a
  short, jittered interval without counting an attempt, logged in one line. Each job's
  code knows its job (``queueing.current``), so a ledger claim records its holder.
* **No health-check round trip per job.** Django would ``SELECT 1`` on a reused connection
  before every job (``CONN_HEALTH_CHECKS``). Here a job thread reconnects once before its
  next job after the worker saw a database error, and drops a connection the server
  ended while it sat idle (its socket is readable: no round trip).
* **One round trip per statement of its own.** procrastinate's connector spends four on
  each fetch, outcome and defer (the pool's liveness check, ``BEGIN``, the statement,
  ``COMMIT``); the worker's (:func:`queueing.connector.worker_connector`, which
  :func:`install` hands to procrastinate's ``worker`` command) runs them in autocommit and
  checks a lent connection by its socket.
* **A hung job does not hold its slot unnoticed** (``queueing.timeouts``). The fetch
  records each run's deadline; an async run is cancelled at it; a sync run, which no one
  can stop, is ended by stalled recovery a grace later, and its outcome is refused (the
  fences match the run's attempt). Each heartbeat counts the hung runs and records them
  with the worker's slots; when they hold every slot, the worker says so once per change
  (``worker_health`` and ``/metrics`` read the record).
* **A stray notification is a wake-up**, not a reason to stop listening; and a loop that
  fails anyway stops the worker with a non-zero exit, as a database outage does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import functools
import json
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, cast

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections
from procrastinate import exceptions as procrastinate_exceptions
from procrastinate import jobs, manager, periodic, retry, utils
from procrastinate import worker as procrastinate_worker
from procrastinate.contrib.django.django_connector import DjangoConnector
from procrastinate.contrib.django.utils import connector_params
from procrastinate.job_context import JobContext, JobResult
from procrastinate.manager import get_channel_for_queues

from queueing import current, flush, giveup, sweeps, timeouts
from queueing.connector import ReplanningCursor, ended_by_server, worker_connector
from queueing.exceptions import JobTimedOut, PollLater
from queueing.logs import takes_job_records
from queueing.outage import RECONNECT_SECONDS, Failures, beat_resume_seconds, describe
from queueing.planner import rows_walking_async
from queueing.sql import array_literal, load
from queueing.sql import queries as queueing_queries
from queueing.stalled import STALLED_SWEEP

__all__ = ["install"]

logger = logging.getLogger(__name__)
queries = load("queueing", "worker.sql")

#: How often the LISTEN connection proves it is alive when no notification comes.
LISTEN_KEEPALIVE_SECONDS = 30.0
#: How long a loop waits for a pooled connection before it counts as a failed attempt.
POOL_TIMEOUT_SECONDS = 5.0
#: How long a starting worker's prune of dead workers waits for a lock on one of their
#: jobs before it leaves the prune to a later start.
PRUNE_LOCK_TIMEOUT_SECONDS = 2.0
#: The maintenance period when no inline sweep is declared (owed give-up hooks).
MAINTENANCE_SECONDS = 10.0
#: Per job thread: the failure epoch its Django connection was last renewed at.
_job_threads = threading.local()
#: A job's outcome that ends it for good, owing its task's give-up hook.
GIVE_UPS = (jobs.Status.FAILED, jobs.Status.ABORTED)
#: procrastinate's records of a job's steps below WARNING, by the level it logs each at
#: (loaded, started, an abort requested): their fields are built only for a handler that
#: keeps them (``PgstageWorker._log_extra``). pgstage's worker saves outcomes itself and
#: never logs procrastinate's ``finish_task``.
#: A job action the filters judge as every outcome (success, retry, failure, abort).
_OUTCOME_ACTION = "job_success"
QUIET_JOB_ACTIONS = {
    "loaded_job_info": logging.DEBUG,
    "start_job": logging.INFO,
    "abort_job": logging.DEBUG,
}


class WorkerStopped(procrastinate_exceptions.ProcrastinateException):
    """The worker stopped on a failure, not because it was asked to: it exits non-zero,
    so that its supervisor (systemd, compose, ``make run``) restarts it."""


class DatabaseUnavailable(WorkerStopped):
    """One of the worker's loops failed for longer than the outage window."""


def outage_seconds() -> float:
    return float(getattr(settings, "QUEUEING_DATABASE_OUTAGE_SECONDS", 300))


def heartbeat_seconds() -> float:
    return float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10))


def stalled_seconds() -> float:
    return float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))


def busy_poll_seconds() -> float:
    """How long a job that raised :class:`PollLater` without a delay of its own waits."""
    return float(getattr(settings, "QUEUEING_BUSY_POLL_SECONDS", 2))


def unrunnable_check_seconds() -> float:
    """How often a worker looks for jobs whose task no live worker has."""
    return float(getattr(settings, "QUEUEING_UNRUNNABLE_CHECK_SECONDS", 60))


def prune_after_seconds() -> float:
    """A worker silent this long is dead for certain: it would have exited after its
    outage window. Its row may go; its jobs are recovered long before."""
    return outage_seconds() + 4 * stalled_seconds()


#: How often a fetch waiting for this worker's beat looks again (:func:`fetch_beat_seconds`).
BEAT_WAIT_POLL_SECONDS = 0.05


def fetch_beat_seconds(heartbeat: float | None = None) -> float:
    """A worker fetches only while its last beat is younger than this (``heartbeat``: its
    interval, the setting's by default): a job fetched then stays clear of stalled
    recovery (which takes the jobs of a worker silent for the stall threshold) until the
    next beat lands, one heartbeat later, with the liveness bound to spare. Never below
    one heartbeat (a threshold that short is ``queueing.W001``'s). The fetch statement
    judges it on the server too, when it runs (``fetch_job`` in ``sql/worker.sql``)."""
    if heartbeat is None:
        heartbeat = heartbeat_seconds()
    return max(heartbeat, stalled_seconds() - heartbeat - beat_resume_seconds(heartbeat))


def _is_missing_worker(exc: BaseException) -> bool:
    """A foreign-key violation on ``worker_id``: this worker's row was pruned."""
    cause = exc.__cause__
    return getattr(getattr(cause, "diag", None), "constraint_name", "") == (
        "procrastinate_jobs_worker_id_fkey"
    )


def _drop_if_ended_by_server() -> None:
    """Close this thread's Django connection when the server ended it while it sat idle
    (``pg_terminate_backend``, ``idle_session_timeout``, a proxy dropping idle sockets),
    so the next query connects afresh instead of failing — without a round trip
    (:func:`queueing.connector.ended_by_server`)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    raw = wrapper.connection
    if raw is None or wrapper.in_atomic_block:
        return
    if ended_by_server(raw):
        wrapper.close()


def _in_django(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run ``func`` on this thread's Django connection, healthy before and after."""
    close_old_connections()
    _drop_if_ended_by_server()
    try:
        return func(*args, **kwargs)
    finally:
        close_old_connections()


async def _beat_on(connection: psycopg.AsyncConnection, params: dict[str, Any]) -> list[Any]:
    cursor = await connection.execute(queries["beat"], params)
    return await cursor.fetchall()


async def _within(
    connection: psycopg.AsyncConnection, query: Awaitable[Any], *, deadline: float
) -> Any:
    """Await ``query`` (on ``connection``) until ``deadline`` (the loop's clock); past it,
    close the connection, then end the query, and raise ``TimeoutError``. Cancelled while
    the query is in flight, psycopg would first send the server a cancel request, on a new
    connection, then wait for the query again — up to 5 s each, never answered across a
    partition — so the heartbeat would notice a half-open link 10 s late."""
    running = asyncio.ensure_future(query)
    try:
        remaining = deadline - asyncio.get_running_loop().time()
        return await asyncio.wait_for(asyncio.shield(running), max(0.0, remaining))
    except TimeoutError:
        await connection.close()  # the query is no longer active: no cancel request
        running.cancel()
        with contextlib.suppress(BaseException):
            await running
        raise


class TaskNameJobManager(manager.JobManager):
    """procrastinate's job manager, except that a worker fetches only jobs of the task
    names its app has, and registers with those names.

    procrastinate's fetch takes any job of the worker's queues; a job of a task the worker
    lacks then fails for good (``TaskNotFound``) — during a rolling deploy, every job of a
    task the new release added that an old worker fetches. Here such a job waits for a
    worker that has its task (``fetch_job`` in ``sql/worker.sql``, which calls
    ``pgstage_fetch_job_v1``: procrastinate's fetch with one more condition, in one
    statement). The names registered with the
    worker (``pgstage_worker_tasks``) tell which waiting jobs no live worker can run
    (:func:`queueing.jobs.unrunnable_tasks`)."""

    def __init__(self, *, connector: Any, tasks: Callable[[], Mapping[str, Any]]):
        super().__init__(connector=connector)
        self._tasks = tasks
        #: Per worker id, what that worker does before each of its fetches, none of its
        #: fetches in flight then (:meth:`PgstageWorker._before_fetch`); false: fetch
        #: nothing (the worker stops).
        self.before_fetch: dict[int, Callable[[], Awaitable[bool]]] = {}
        #: How recent the fetching worker's last beat must be, judged by the fetch
        #: statement (:func:`fetch_beat_seconds` of the worker's own heartbeat; the
        #: setting's when no worker set it).
        self.beat_seconds: float | None = None

    def task_names(self) -> list[str]:
        """Every name a job of this app's tasks may carry (aliases included)."""
        return sorted(self._tasks())

    async def fetch_job(self, queues: Iterable[str] | None, worker_id: int) -> jobs.Job | None:
        hook = self.before_fetch.get(worker_id)
        if hook is not None and not await hook():
            return None  # the worker stops: nothing more to fetch
        # One short statement: the function (pgstage_fetch_job_v1) runs under the index
        # walk's planner settings and keeps its generic plan per server session
        # (queueing.planner).
        row = await self.connector.execute_query_one_async(
            queries["fetch_job"], **self.fetch_params(queues, worker_id)
        )
        return None if row["id"] is None else jobs.Job.from_row(row)

    def fetch_params(self, queues: Iterable[str] | None, worker_id: int) -> dict[str, Any]:
        """The fetch statement's parameters (``fetch_job`` in ``sql/worker.sql``). The
        arrays go as array literals (cached): dumping them element by element on every
        fetch was a third of the fetch's client time."""
        timeout_tasks, timeout_seconds = timeouts.for_tasks(self._tasks())
        return {
            "queues": array_literal(tuple(queues)) if queues is not None else None,
            "worker_id": worker_id,
            "task_names": array_literal(tuple(self.task_names())),
            "timeout_tasks": array_literal(tuple(timeout_tasks)),
            "timeout_seconds": array_literal(tuple(timeout_seconds)),
            "unflushed": array_literal(flush.for_tasks(self._tasks())),
            "beat_seconds": self.beat_seconds or fetch_beat_seconds(),
        }

    async def register_worker(self, queues: Iterable[str] | None = None) -> int:
        """Register, with this app's task names, the worker's ``queues`` (None: all) and
        the tasks it has a give-up hook of."""
        row = await self.connector.execute_query_one_async(
            query=queries["register_worker"],
            task_names=self.task_names(),
            queues=list(queues) if queues is not None else None,
            hooks=giveup.hooked_tasks(),
        )
        return row["worker_id"]


def fetch_by_task_name(app: Any) -> TaskNameJobManager:
    """Give ``app`` the :class:`TaskNameJobManager` (idempotent); returns it."""
    if not isinstance(app.job_manager, TaskNameJobManager):
        app.job_manager = TaskNameJobManager(connector=app.connector, tasks=lambda: app.tasks)
    return app.job_manager


class PgstageWorker(procrastinate_worker.Worker):
    """procrastinate's worker with a drain heartbeat, a maintenance loop, database-outage
    resilience, fenced outcomes and give-up hooks (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("update_heartbeat_interval", heartbeat_seconds())
        self.job_manager = fetch_by_task_name(kwargs["app"] if "app" in kwargs else args[0])
        middleware = list(kwargs.get("task_middleware") or [])
        kwargs["task_middleware"] = [
            self._fresh_connection,
            self._in_job,
            self._in_async_job,
            *middleware,
        ]
        super().__init__(*args, **kwargs)
        self._warn_without_sweep_queue()
        # The fetch statement judges this worker's last beat by this worker's interval.
        self.job_manager.beat_seconds = fetch_beat_seconds(self.update_heartbeat_interval)
        # Every Django connection of this process is built from this one settings dict.
        connections.settings[DEFAULT_DB_ALIAS]["CONN_HEALTH_CHECKS"] = False
        self._gave_up: str | None = None
        self._side_task_failed: str | None = None
        #: When the heartbeat last beat, on its own connection (monotonic clock).
        self._last_beat = float("-inf")
        #: When the last beat that landed was sent (monotonic clock): the server's
        #: ``last_heartbeat`` is no older (its ``now()`` is the beat's start). What a fetch
        #: weighs (:meth:`_beat_before_fetch`); registering counts as a beat.
        self._beat_sent = float("-inf")
        #: How many hung runs held every slot when last said (0: not all slots).
        self._hung_reported = 0
        self.failures = Failures(
            window=outage_seconds(), on_expired=self._give_up, reachable=self._beat_lately
        )
        self._pool: Any = None
        #: When this worker last looked for jobs it holds but does not run
        #: (``_requeue_orphans``); whether the next fetch must look first.
        self._orphans_checked = time.monotonic()
        self._look_forced = False
        #: The worker id its look is hooked to, before each fetch (``_hook_fetches``).
        self._hooked_id: int | None = None
        #: The id this worker last had, once it stopped (:meth:`_current_worker_id`).
        self._last_worker_id: int | None = None
        #: The round trip that decides whether a streak of unreachable is an outage.
        self._probe: asyncio.Task[None] | None = None
        self._registering = asyncio.Lock()
        self._errors: dict[int, BaseException] = {}
        #: Runs (job id, attempts) whose code saved their own success in a transaction
        #: that committed (``queueing.current.JobRun.saved``): nothing more to save. Only
        #: runs not settled yet (``_unsettled``) are noted; both under ``_runs_lock``
        #: (the job threads note, the event loop settles).
        self._saved_by_task: set[tuple[int, int]] = set()
        self._unsettled: set[tuple[int, int]] = set()
        self._runs_lock = threading.Lock()
        # Two threads for the worker's own Django work, each with one Django connection,
        # never taking a job's slot: maintenance (stalled recovery), and give-up hooks —
        # apart, so a burst of slow hooks never delays recovery.
        self._maintenance = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="pgstage-maintenance"
        )
        self._hooks = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="pgstage-give-up-hooks"
        )

    def _warn_without_sweep_queue(self) -> None:
        """The sweeps' jobs have a queue of their own; a worker given ``--queues`` without
        it never runs them, and with no other worker taking it they wait for ever (the
        inline recovery still runs: it is no job)."""
        if self.queues is None or sweeps.SWEEP_QUEUE in self.queues:
            return
        job_sweeps = [name for name, sweep in sweeps.sweeps().items() if not sweep.inline]
        if job_sweeps:
            logger.warning(
                "this worker does not take the %r queue, where the sweeps %s run: they "
                "run only if another worker does (procrastinate worker --queues %s)",
                sweeps.SWEEP_QUEUE,
                ", ".join(job_sweeps),
                sweeps.SWEEP_QUEUE,
            )

    def _fresh_connection(self, call_next: Callable[[], Any], context: Any, worker: Any) -> Any:
        """Sync task middleware, in the job's thread: after the worker saw a database
        error, this thread's connection may be dead; drop it once; and drop it when the
        server ended it while idle. Either way the job's first query connects afresh
        instead of failing (and costing the job an attempt) — without a health-check
        round trip per job."""
        epoch = self.failures.epoch
        if getattr(_job_threads, "epoch", 0) != epoch:
            connections.close_all()
            _job_threads.epoch = epoch
        else:
            _drop_if_ended_by_server()
        return call_next()

    def _job_run(self, job: jobs.Job) -> current.JobRun:
        """What the job's code knows of its run (``queueing.current``): enough to save its
        own success, fenced as :meth:`_persist_job_status` saves it, in the transaction of
        its last write (``Ledger.complete(..., finish_job=True)``)."""
        assert job.id is not None
        return current.JobRun(
            job_id=job.id,
            attempts=job.attempts,
            worker=self._current_worker_id,
            delete_on_success=self.delete_jobs
            in (jobs.DeleteJobCondition.ALWAYS, jobs.DeleteJobCondition.SUCCESSFUL),
            commit_within_seconds=stalled_seconds(),
            saved=functools.partial(self._note_saved_by_task, (job.id, job.attempts)),
        )

    def _current_worker_id(self) -> int | None:
        """This worker's id now (it moves on in :meth:`_register_again`); read from a
        job's thread, an int attribute read is atomic. Once the worker stopped (its id
        cleared), the last one it had: a sync run that outlived the stop stays fenced on
        it, never unfenced."""
        return self.worker_id if self.worker_id is not None else self._last_worker_id

    def _note_saved_by_task(self, run: tuple[int, int]) -> None:
        """In the job's thread, once the transaction that saved the run's success
        committed: the worker saves nothing more — unless it already settled the run (an
        async run cancelled while its thread went on to commit), which it will not look
        at again: noted then, the run would stay in memory for good."""
        with self._runs_lock:
            if run in self._unsettled:
                self._saved_by_task.add(run)

    def _in_job(self, call_next: Callable[[], Any], context: Any, worker: Any) -> Any:
        """Sync task middleware: the job's code knows its job (``queueing.current``)."""
        with current.running(context.job.id, run=self._job_run(context.job)):
            return call_next()

    def _unsettle(self, job: jobs.Job) -> None:
        """The run is about to start: its outcome is not settled until
        :meth:`_persist_job_status` looks at it."""
        assert job.id is not None
        with self._runs_lock:
            self._unsettled.add((job.id, job.attempts))

    def _settled_by_task(self, job: jobs.Job) -> bool:
        """Whether the run's code saved its success (a transaction that committed); either
        way the run is settled from now on."""
        assert job.id is not None
        run = (job.id, job.attempts)
        with self._runs_lock:
            self._unsettled.discard(run)
            if run in self._saved_by_task:
                self._saved_by_task.discard(run)
                return True
            return False

    async def _in_async_job(
        self, call_next: Callable[[], Awaitable[Any]], context: Any, worker: Any
    ) -> Any:
        """Async task middleware: as :meth:`_in_job`, for async tasks; and a run that
        outlives its task's timeout is cancelled, and fails as an attempt with
        :class:`~queueing.exceptions.JobTimedOut` (as a hung sync run does in stalled
        recovery), so it never holds its slot past it (``queueing.timeouts``)."""
        bound = timeouts.timeout_seconds(context.task.name)
        scope = asyncio.timeout(bound if bound > 0 else None)
        with current.running(context.job.id, run=self._job_run(context.job)):
            try:
                async with scope:
                    return await call_next()
            except TimeoutError as exc:
                if scope.expired():
                    raise JobTimedOut(f"its run outlived its timeout ({bound:g} s)") from exc
                raise

    # -- the outage window -------------------------------------------------------------

    def _beat_lately(self) -> bool:
        """The database answered the heartbeat's own connection within two intervals."""
        return time.monotonic() - self._last_beat < 2 * self.update_heartbeat_interval

    async def _reopen_pool(self) -> None:
        """The database accepts connections again (the heartbeat's or LISTEN's own
        connection just got through after failing): the pool opens the connections it
        gave up on now (its ``check`` replaces dead ones and grows an empty pool back to
        its size), and a loop waiting for one gets it at once."""
        if self._pool is None:
            return
        try:
            await self._pool.check()
        except Exception as exc:  # the pool grows on demand anyway; this only hurries it
            logger.warning("could not reopen the pool's connections now: %s", describe(exc))

    def _give_up(self, reason: str, *, unreachable: bool = False) -> None:
        """A loop's failure streak reached the window. Out of reach: stop only once one
        round trip of its own, now, fails too — an attempt begun before the database
        came back may report its failure after (a pool checkout that timed out while
        the pool had not reopened yet)."""
        if unreachable:
            self._probe = asyncio.get_running_loop().create_task(self._stop_unless_answered(reason))
            return
        logger.error("stopping the worker: %s", reason)
        self._gave_up = reason
        self.stop()

    async def _stop_unless_answered(self, reason: str) -> None:
        try:
            async with asyncio.timeout(RECONNECT_SECONDS):
                async with await psycopg.AsyncConnection.connect(
                    **connector_params(), autocommit=True
                ) as connection:
                    await connection.execute("SELECT 1")
        except (psycopg.Error, OSError, TimeoutError):
            self._give_up(reason)
            return
        logger.warning("%s; but the database answers again: not giving up", reason)
        self.failures.reprieve()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up at once when the worker is asked to stop."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), timeout=seconds)

    async def _with_retries(self, loop: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call`` until it succeeds; between failures, back off (one log line per
        attempt). Raises :class:`DatabaseUnavailable` once the worker gave up."""
        while True:
            try:
                result = await call()
            except procrastinate_exceptions.ConnectorException as exc:
                pause = self.failures.failed(loop, exc)
                if self._gave_up is not None:
                    raise DatabaseUnavailable(self._gave_up) from exc
                await asyncio.sleep(pause)
                continue
            self.failures.recovered(loop)
            return result

    async def _in_maintenance_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._maintenance, functools.partial(_in_django, func, *args)
        )

    async def _in_hooks_thread(self, func: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._hooks, functools.partial(_in_django, func, *args))

    # -- start, register, prune --------------------------------------------------------

    async def run(self) -> None:
        # As procrastinate's run(), with the start-up queries retried (the database may
        # still be coming up) and the prune threshold long enough for an outage.
        self._stop_event.clear()
        connector = self.app.connector
        await self._with_retries("pruning dead workers", self._prune_dead_workers)
        registering = time.monotonic()

        async def register() -> int:
            nonlocal registering
            registering = time.monotonic()  # each attempt's own: a retry's row is younger
            # TaskNameJobManager's registration also records the worker's queues
            return await self.app.job_manager.register_worker(self.queues)  # type: ignore[call-arg]

        self.worker_id = await self._with_retries("registering the worker", register)
        self._last_beat = time.monotonic()
        self._beat_sent = registering  # its row was born with a beat (now())
        # Fail fast when the pool has no live connection to give (its default is 30 s):
        # each loop then backs off and says so, instead of hanging silently. And never
        # let the pool retry a lost connection on its own doubling schedule (up to 128 s
        # apart, then it drops it): it gives up at once, and opens it again when a loop
        # asks for one or when the database is back (_reopen_pool).
        self._pool = getattr(connector, "pool", None)
        if self._pool is not None:
            self._pool.timeout = POOL_TIMEOUT_SECONDS
            self._pool.reconnect_timeout = RECONNECT_SECONDS
        self.run_task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        loop_task = asyncio.create_task(self._run_loop(), name="worker loop")
        try:
            await asyncio.shield(loop_task)
        except asyncio.CancelledError:
            self.stop()
            await loop_task
            raise
        finally:
            self._loop = None
            for executor in (self._maintenance, self._hooks):
                # Its thread's Django connection closes with it, after what is queued.
                executor.submit(connections.close_all)
                executor.shutdown(wait=False)
        if self._gave_up is not None:
            raise DatabaseUnavailable(self._gave_up)
        if self._side_task_failed is not None:
            raise WorkerStopped(self._side_task_failed)

    async def _prune_dead_workers(self) -> None:
        """Delete the rows of workers dead for certain (:func:`prune_after_seconds`). Best
        effort: their jobs are recovered whether or not their rows go, so a prune held by
        a lock on one of their jobs (``PRUNE_LOCK_TIMEOUT_SECONDS``) is left for a later
        start rather than holding this one."""
        try:
            pruned = await self.app.connector.execute_query_all_async(
                queries["prune_dead_workers"],
                seconds=prune_after_seconds(),
                lock_timeout_ms=str(round(PRUNE_LOCK_TIMEOUT_SECONDS * 1000)),
            )
        except procrastinate_exceptions.ConnectorException as exc:
            if not isinstance(exc.__cause__, psycopg.errors.LockNotAvailable):
                raise
            logger.warning(
                "did not prune dead workers now: another transaction holds one of their "
                "jobs (%s); a later start will",
                describe(exc),
            )
            return
        if pruned:
            logger.info("pruned dead workers: %s", ", ".join(str(r["id"]) for r in pruned))

    async def _register_again(self, old: int | None) -> None:
        """Our row ``old`` is gone (pruned while we were cut off): register anew and take
        back our running jobs, in one statement. Serialised, and a no-op when the id has
        already moved on (the fetch loop and the heartbeat may both notice) or when the
        row ``old`` is there after all (a fetch sent with the id this worker had before
        it registered again: the statement registers only when the old row is gone)."""
        async with self._registering:
            if self.worker_id != old:
                return
            running = [c.job.id for c in self._running_jobs.values() if c.job.id]
            registering = time.monotonic()
            row = await self.app.connector.execute_query_one_async(
                queries["register_and_adopt"],
                old_worker_id=old,
                job_ids=running,
                task_names=self.job_manager.task_names(),
                queues=list(self.queues) if self.queues is not None else None,
                hooks=giveup.hooked_tasks(),
            )
            if not row["registered"]:
                return
            self.worker_id = row["worker_id"]
            self._last_beat = time.monotonic()
            self._beat_sent = registering  # the new row was born with a beat
            if self._hooked_id is not None:
                self._hook_fetches()  # the fetches under the new id look and wait as before
        lost = sorted(set(running) - set(row["adopted"]))
        logger.warning(
            "worker %s was pruned while cut off from the database; registered again as %s "
            "and took back %d running job(s)%s",
            old,
            self.worker_id,
            len(row["adopted"]),
            f"; job(s) {lost} were recovered elsewhere meanwhile" if lost else "",
        )

    # -- the loops ---------------------------------------------------------------------

    async def _fetch_and_process_jobs(self) -> None:
        failed = False
        while not self._stop_event.is_set():
            self._hook_fetches()
            try:
                if failed:
                    await self._requeue_orphans()
                await super()._fetch_and_process_jobs()
            except procrastinate_exceptions.ConnectorException as exc:
                if _is_missing_worker(exc):
                    await self._with_retries(
                        "registering the worker again",
                        functools.partial(self._register_again, self.worker_id),
                    )
                    continue
                failed = True
                # A poll at once after the pause, whatever LISTEN said meanwhile.
                await self._pause(self.failures.failed("fetching jobs", exc))
                continue
            self.failures.recovered("fetching jobs")
            return

    def _hook_fetches(self) -> None:
        """Before each fetch of this worker (its id may change: ``_register_again``), a
        recent beat and the look for jobs it holds but does not run, when due
        (:meth:`_before_fetch`)."""
        assert self.worker_id is not None
        hooks = self.job_manager.before_fetch
        if self._hooked_id is not None and self._hooked_id != self.worker_id:
            hooks.pop(self._hooked_id, None)
        hooks[self.worker_id] = self._before_fetch
        self._hooked_id = self.worker_id

    async def _before_fetch(self) -> bool:
        """Before a fetch: a recent beat (:meth:`_beat_before_fetch`), then the look for
        jobs held but not run, when due. False when the worker stops meanwhile."""
        if not await self._beat_before_fetch():
            return False
        await self._look_if_due()
        return True

    async def _beat_before_fetch(self) -> bool:
        """Wait until this worker's last beat is recent enough for a job fetched now to
        keep looking alive until the next beat lands (:func:`fetch_beat_seconds`). Once
        the worker was cut off (a partition, a dropped link), its pool may get a fetch
        through before its heartbeat's own connection beats again: the job would be
        ``doing`` under a worker whose heartbeat is long past the stall threshold, and any
        worker's stalled recovery (this one's too) would put it back while it runs, for
        another worker to run it at the same time. False when the worker stops meanwhile
        (nothing to fetch then)."""
        interval = self.update_heartbeat_interval
        bound = self.job_manager.beat_seconds or fetch_beat_seconds(interval)
        said = False
        while time.monotonic() - self._beat_sent >= bound:
            if self._stop_event.is_set():
                return False
            # Said once a beat was missed (cut off), not for the moment a routine beat
            # lands a little after the bound.
            if not said and time.monotonic() - self._beat_sent >= bound + interval:
                logger.info(
                    "worker %s fetches again once its heartbeat lands (its last beat was "
                    "%.0f s ago)",
                    self.worker_id,
                    time.monotonic() - self._beat_sent,
                )
                said = True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_event.wait(), timeout=BEAT_WAIT_POLL_SECONDS)
        return not self._stop_event.is_set()

    async def _look_if_due(self) -> None:
        """Before a fetch: look for jobs held but not run when a run this worker was
        fetched again during has ended (:meth:`_force_look`), or once a stall threshold
        has passed since the last look — with a backlog too, since procrastinate's fetch
        loop then never starts over."""
        if self._look_forced or time.monotonic() - self._orphans_checked >= stalled_seconds():
            await self._requeue_orphans()

    def _force_look(self, _ended: asyncio.Task[Any] | None = None) -> None:
        """A run ended that this worker had fetched again meanwhile: the next fetch looks
        first (woken now, when the worker waits for work)."""
        self._look_forced = True
        self._new_job_event.set()

    async def _requeue_orphans(self) -> None:
        """Jobs 'doing' under this (live, heart-beating) worker that it does not run are
        invisible to stalled recovery: a fetch whose reply was lost may have committed
        one, and a second fetch of a job this worker still ran leaves one when the first
        run's outcome was refused. Put each back; one whose SHORT key a fresh job now
        holds ends failed (superseded), one whose abort was requested ends aborted. Only
        with no fetch of ours in flight: from the fetch loop after a failed fetch, and
        before a fetch (:meth:`_look_if_due`)."""
        # A run that ends while this looks forces the next look: cleared before the read.
        self._look_forced = False
        connector = self.app.connector
        running = [c.job.id for c in self._running_jobs.values() if c.job.id]
        orphans = await connector.execute_query_all_async(
            queries["orphans"], worker_id=self.worker_id, running=running
        )
        for orphan in orphans:
            fenced = {
                "job_id": orphan["id"],
                "worker_id": self.worker_id,
                "attempts": None,
                "delete_job": False,
                "owed_reason": None,
            }
            if orphan["abort_requested"]:
                note = "aborted as requested"
                if giveup.owes(orphan["task_name"]):
                    # It never ran and never will: its domain settles, as for any abort.
                    fenced["owed_reason"] = f"its job {orphan['id']} was aborted before it ran"
                await connector.execute_query_all_async(
                    queries["finish_job_fenced"], status="aborted", **fenced
                )
            else:
                try:
                    requeued = await connector.execute_query_all_async(
                        queries["requeue_orphan"], job_id=orphan["id"], worker_id=self.worker_id
                    )
                    if not requeued:
                        continue  # no longer this worker's (re-registered meanwhile)
                    note = "put back to todo"
                except procrastinate_exceptions.UniqueViolation:
                    note = "superseded by a waiting job with its queueing lock"
                    await connector.execute_query_all_async(
                        queries["finish_job_fenced"], status="failed", **fenced
                    )
            logger.warning(
                "job %s was held by this worker, which was not running it (the reply of "
                "its fetch lost, or its outcome never saved): %s",
                orphan["id"],
                note,
            )
        self._orphans_checked = time.monotonic()

    async def _process_job(self, context: JobContext) -> None:
        # A fetch that found a job is a successful round trip as much as one that found
        # none: with a backlog, the fetch loop never sees the latter between faults.
        self.failures.recovered("fetching jobs")
        # This worker fetched a job it is still running: stalled recovery took it back
        # while this worker looked dead, and this worker fetched it again. The first run
        # goes on and saves its outcome on this fetch's row; a second one here would run
        # it twice. When the first run's outcome was refused (saved while the job waited,
        # before this fetch took it back), the job is this worker's and no run of it is
        # left: the look before the next fetch once the first run has ended puts it back
        # (_force_look), and it runs once. This fetch's slot is free meanwhile.
        # A run whose attempt recovery ended as timed out is no longer this job's: the
        # new attempt runs (the hung run's outcome will be refused).
        job_id, attempts = context.job.id, context.job.attempts
        earlier = [
            task
            for task, c in self._running_jobs.items()
            if c.job.id == job_id and c.job.attempts == attempts and c is not context
        ]
        if earlier:
            logger.warning(
                "job %s was fetched again while this worker still runs it (it looked dead "
                "for a moment); the running one goes on, and the job is looked at again "
                "once it ends",
                job_id,
            )
            for task in earlier:
                task.add_done_callback(self._force_look)
            return
        self._unsettle(context.job)
        await super()._process_job(context)

    async def _update_heartbeat(self) -> None:
        """Beat every interval on a connection of its own, never the pool's: while the
        database is away, try again every ``RECONNECT_SECONDS`` (or every interval, when
        shorter), so a live worker beats again within one heartbeat interval of the
        database accepting connections. Each attempt (connecting, beating) is bounded by
        the interval (at least ``RECONNECT_SECONDS``): a half-open connection (a dropped
        link, a partition) is dropped and replaced, not waited on."""
        interval = self.update_heartbeat_interval
        bound = max(interval, RECONNECT_SECONDS)
        connection: psycopg.AsyncConnection | None = None
        pause = interval
        try:
            while True:
                await asyncio.sleep(pause)
                try:
                    beating = self.worker_id
                    deadline = asyncio.get_running_loop().time() + bound
                    async with asyncio.timeout_at(deadline):
                        if connection is None or connection.closed:
                            connection = await psycopg.AsyncConnection.connect(
                                **connector_params(),
                                autocommit=True,
                                cursor_factory=ReplanningCursor,
                            )
                    sent = time.monotonic()
                    rows = await _within(
                        connection, _beat_on(connection, self._beat_params()), deadline=deadline
                    )
                except TimeoutError:
                    # No answer in time: a half-open link, or a server too slow to accept.
                    exc = psycopg.OperationalError(f"no answer within {bound:g} s")
                    if connection is not None:
                        await connection.close()
                        connection = None
                    pause = min(interval, self.failures.failed("beating", exc))
                    continue
                except (psycopg.Error, OSError) as exc:
                    if connection is not None:
                        await connection.close()
                        connection = None
                    pause = min(interval, self.failures.failed("beating", exc))
                    continue
                self._last_beat = time.monotonic()
                self.failures.answered()
                if rows:
                    self._beat_sent = sent
                    self._note_hung(rows[0][1])
                if self.failures.failing("beating"):
                    self.failures.recovered("beating")
                    await self._reopen_pool()
                pause = interval
                if not rows:
                    try:
                        await self._register_again(beating)
                    except procrastinate_exceptions.ConnectorException as exc:
                        pause = min(interval, self.failures.failed("registering again", exc))
                        continue
                    self.failures.recovered("registering again")
        finally:
            if connection is not None:
                await connection.close()

    def _beat_params(self) -> dict[str, Any]:
        running = [c.job for c in self._running_jobs.values() if c.job.id is not None]
        return {
            "worker_id": self.worker_id,
            "running": [job.id for job in running],
            "attempts": [job.attempts for job in running],
            "grace": timeouts.grace_seconds(),
            "slots": self.concurrency,
        }

    def _note_hung(self, hung: int) -> None:
        """Say once per change when hung runs (past their timeout and grace: a sync thread
        cannot be stopped) hold every slot of this worker, and when that ends: it does no
        work until its supervisor restarts it (``worker_health`` exits 1)."""
        all_hung = hung >= self.concurrency
        if all_hung and hung != self._hung_reported:
            logger.warning(
                "all %d slot(s) of worker %s are held by hung jobs (past their timeout: "
                "their runs were ended, their threads cannot be stopped); it runs nothing "
                "until it is restarted (manage.py worker_health fails)",
                self.concurrency,
                self.worker_id,
            )
            self._hung_reported = hung
        elif not all_hung and self._hung_reported:
            logger.info(
                "worker %s has a free slot again (%d hung job(s) left)", self.worker_id, hung
            )
            self._hung_reported = 0

    async def _periodic_deferrer(self) -> None:
        while True:
            deferrer = _ReportingDeferrer(
                registry=self.app.periodic_registry,
                on_success=functools.partial(self.failures.recovered, "deferring periodic jobs"),
                **self.app.periodic_defaults,
            )
            try:
                return await deferrer.worker()
            except procrastinate_exceptions.ConnectorException as exc:
                await asyncio.sleep(self.failures.failed("deferring periodic jobs", exc))

    async def _poll_jobs_to_abort(self) -> None:
        """procrastinate's poll for abort requests, every ``abort_job_polling_interval``
        while a job runs; a failure is one line of the loop's own (procrastinate logs
        each at ERROR with its traceback, every interval of an outage). It never stops
        the worker: a late abort is no outage."""
        loop = "polling for abort requests"
        pause = self.abort_job_polling_interval
        while True:
            await asyncio.sleep(pause)
            pause = self.abort_job_polling_interval
            if not self._running_jobs:
                continue
            try:
                job_ids = await self.app.job_manager.list_jobs_to_abort_async()
            except procrastinate_exceptions.ConnectorException as exc:
                # The next attempt after the pause the failure's line names.
                pause = self.failures.failed(loop, exc, bounded=False)
                continue
            self.failures.recovered(loop)
            self._handle_abort_jobs_requested(job_ids)

    def _maintenance_period(self) -> float:
        inline = [s for s in sweeps.sweeps().values() if s.inline]
        return min((s.every_seconds for s in inline), default=MAINTENANCE_SECONDS)

    async def _every_period(
        self, loop: str, run: Callable[[], Awaitable[Any]], period: float
    ) -> None:
        """``run`` on a steady cadence: each pass starts one period after the previous
        one started (at once when a pass took longer), so a pass's own time never
        stretches the gap between two (stalled recovery's clock counts such gaps)."""
        clock = asyncio.get_running_loop()
        next_at = clock.time() + period
        while True:
            await asyncio.sleep(max(0.0, next_at - clock.time()))
            next_at = clock.time() + period
            try:
                await run()
            except Exception as exc:
                await asyncio.sleep(self.failures.failed(loop, exc))
                continue
            self.failures.recovered(loop)

    async def _maintain(self) -> None:
        """The inline sweeps (stalled recovery) under their try-locks, every period, in
        this worker's maintenance thread — beside the jobs, never behind them."""
        inline = [s for s in sweeps.sweeps().values() if s.inline]

        async def sweep_all() -> None:
            for sweep in inline:
                await self._in_maintenance_thread(sweeps.run_sweep, sweep.name)

        if not inline:
            await asyncio.Event().wait()  # nothing to run; a side task must not end
        await self._every_period("running stalled recovery", sweep_all, self._maintenance_period())

    async def _settle_owed(self) -> None:
        """Every period, in the give-up hooks' thread: the hooks still owed (a worker
        died, or lost its commit's reply, before it ran one)."""
        await self._every_period(
            "running owed give-up hooks",
            lambda: self._in_hooks_thread(giveup.settle_owed),
            self._maintenance_period(),
        )

    async def _watch_unrunnable(self) -> None:
        """Every ``QUEUEING_UNRUNNABLE_CHECK_SECONDS``: say once per task name when jobs
        wait that no live worker can run (this worker fetches only its own tasks' jobs,
        and so does every other), and once when they have a worker again or are gone —
        never a line per job or per check."""
        reported: set[str] = set()

        async def check() -> None:
            rows = await rows_walking_async(
                self.app.connector,
                queueing_queries["unrunnable_tasks"],
                seconds=stalled_seconds(),
                clock=STALLED_SWEEP,
            )
            now = {row["task_name"]: row for row in rows}
            for name in sorted(now.keys() - reported):
                logger.warning(
                    "%d job(s) of task %s wait (oldest: job %s; queue(s) %s): no live "
                    "worker that has this task listens to their queue; they run when "
                    "one starts, or an operator cancels them (docs/deploy.md, mixed "
                    "releases)",
                    now[name]["jobs"],
                    name,
                    now[name]["oldest_job_id"],
                    ", ".join(now[name]["queues"]),
                )
            for name in sorted(reported - now.keys()):
                logger.info("jobs of task %s no longer wait without a worker", name)
            reported.clear()
            reported.update(now)

        await self._every_period("looking for unrunnable jobs", check, unrunnable_check_seconds())

    async def _listen(self) -> None:
        """LISTEN on a session connection of its own; on any failure, connect again with
        backoff. Each time LISTEN is (re)established, poll once at once: notifications
        sent while it was down are lost, their jobs are not. Unbounded: without LISTEN
        the worker still polls."""
        channels = list(get_channel_for_queues(queues=self.queues))
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **connector_params(), autocommit=True, cursor_factory=ReplanningCursor
                ) as connection:
                    for channel in channels:
                        await connection.execute(
                            psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
                        )
                    if self.failures.failing("listening for jobs"):
                        self.failures.recovered("listening for jobs")
                        await self._reopen_pool()
                    self._new_job_event.set()
                    while True:
                        async for notify in connection.notifies(timeout=LISTEN_KEEPALIVE_SECONDS):
                            await self._on_notify(notify)
                        await connection.execute("SELECT 1")
            except (psycopg.Error, OSError) as exc:
                await asyncio.sleep(self.failures.failed("listening for jobs", exc, bounded=False))

    async def _on_notify(self, notify: psycopg.Notify) -> None:
        """procrastinate's notification, or — for a payload that is not one (an operator's
        bare ``NOTIFY``, another tool's) — a wake-up: never a reason to stop listening,
        which would stop the worker."""
        try:
            notification = json.loads(notify.payload)
            if not isinstance(notification, dict) or "type" not in notification:
                raise ValueError("no notification type")
            # Its type is known; procrastinate reads a job id only for its own types.
            await self._handle_notification(
                channel=notify.channel, notification=cast(jobs.Notification, notification)
            )
        except (ValueError, KeyError, TypeError):
            logger.warning(
                "a notification on %s is not procrastinate's (%r); taken as a wake-up",
                notify.channel,
                notify.payload[:200],
            )
            self._new_job_event.set()

    async def _monitor_side_tasks(self, side_tasks: list[asyncio.Task[Any]]) -> None:
        # procrastinate stops the worker when a side task fails, and the worker then
        # exits 0, as if asked to stop: a supervisor restarting on failure only would
        # leave it down. Every loop here retries what it can; one that still failed is a
        # bug, and the exit status says so.
        await super()._monitor_side_tasks(side_tasks)
        for side_task in side_tasks:
            if side_task.done() and not side_task.cancelled() and side_task.exception():
                self._side_task_failed = (
                    f"its {side_task.get_name()} loop failed: {side_task.exception()!r}"
                )
                return

    def _start_side_tasks(self) -> list[asyncio.Task[Any]]:
        side_tasks = [
            asyncio.create_task(self._update_heartbeat(), name="update_heartbeats"),
            asyncio.create_task(self._periodic_deferrer(), name="deferrer"),
            asyncio.create_task(self._poll_jobs_to_abort(), name="poll_jobs_to_abort"),
            asyncio.create_task(self._maintain(), name="maintenance"),
            asyncio.create_task(self._settle_owed(), name="give_up_hooks"),
            asyncio.create_task(self._watch_unrunnable(), name="unrunnable_tasks"),
        ]
        if self.listen_notify:
            side_tasks.append(asyncio.create_task(self._listen(), name="listener"))
        return side_tasks

    # -- a job's log records -----------------------------------------------------------

    def _log_extra(
        self, action: str, context: JobContext | None, job_result: JobResult | None, **kwargs: Any
    ) -> dict[str, Any]:
        # procrastinate builds a job step's fields (the job as a dict, the worker) whether
        # or not a handler keeps the record; none does with job lines off
        # (JOB_LOG_LEVEL=WARNING). The record itself still goes out, with its action.
        level = QUIET_JOB_ACTIONS.get(action)
        if (
            context is not None
            and level is not None
            and not takes_job_records(self.logger, level, action)
        ):
            return {"action": action}
        return super()._log_extra(action=action, context=context, job_result=job_result, **kwargs)

    # -- a job's outcome ---------------------------------------------------------------

    def _log_job_outcome(
        self,
        status: jobs.Status,
        context: JobContext,
        job_result: JobResult | None,
        job_retry: procrastinate_exceptions.JobRetry | None,
        exc_info: bool | BaseException = False,
    ) -> None:
        # Keep the failure for the give-up hook's reason (procrastinate logs it and drops
        # it before it saves the outcome).
        if isinstance(exc_info, BaseException) and context.job.id is not None:
            self._errors[context.job.id] = exc_info
        if isinstance(exc_info, PollLater) and status == jobs.Status.FAILED:
            # Not a failure: one line, no traceback, however often it polls.
            job = context.job
            logger.info("job %s (%s) polls again: %s", job.id, job.task_name, exc_info)
            return
        # procrastinate logs the outcome on its module's logger (not a named worker's).
        failed = status == jobs.Status.FAILED and not job_retry
        level = logging.ERROR if failed else logging.INFO
        if not takes_job_records(procrastinate_worker.logger, level, _OUTCOME_ACTION):
            return  # no handler keeps it: procrastinate would build it for nothing
        super()._log_job_outcome(status, context, job_result, job_retry, exc_info)

    async def _persist_job_status(
        self,
        job: jobs.Job,
        status: jobs.Status,
        retry_decision: retry.RetryDecision | None,
        context: JobContext,
        job_result: JobResult | None,
    ) -> None:
        assert job.id
        connector = self.app.connector
        error = self._errors.pop(job.id, None)
        if self._settled_by_task(job):
            self._job_ids_to_abort.pop(job.id, None)
            if status != jobs.Status.SUCCEEDED:
                logger.warning(
                    "job %s (%s) ended %s after its code had saved its success (with its "
                    "ledger's complete): the saved success stands",
                    job.id,
                    job.task_name,
                    status.value,
                )
            return
        owes_hook = giveup.owes(job.task_name)
        owed_reason = None
        if status in GIVE_UPS and owes_hook:
            owed_reason = (
                f"its job {job.id} failed for good after {job.attempts + 1} attempt(s)"
                if status == jobs.Status.FAILED
                else f"its job {job.id} was aborted"
            )
            if error is not None:
                owed_reason += f": {describe(error)}"
        poll_at = None
        if isinstance(error, PollLater) and status == jobs.Status.FAILED:
            seconds = error.seconds if error.seconds is not None else busy_poll_seconds()
            poll_at = utils.utcnow() + datetime.timedelta(
                seconds=random.uniform(seconds / 2, seconds)
            )

        async def persist() -> str:
            decision = retry_decision
            if poll_at is not None:
                rows = await connector.execute_query_all_async(
                    queries["poll_job_fenced"],
                    job_id=job.id,
                    worker_id=self.worker_id,
                    attempts=job.attempts,
                    retry_at=poll_at,
                )
                if rows:
                    return "polls"
                # Taken, its abort was requested, or it polled past its timeout: a
                # failed attempt, as its retry strategy decided (the fences below tell).
            if decision is not None:
                try:
                    rows = await connector.execute_query_all_async(
                        queries["retry_job_fenced"],
                        job_id=job.id,
                        worker_id=self.worker_id,
                        attempts=job.attempts,
                        retry_at=decision.retry_at or utils.utcnow(),
                        priority=decision.priority,
                        queue=decision.queue,
                        lock=decision.lock,
                        abort_reason=f"its job {job.id} was aborted" if owes_hook else None,
                    )
                    if not rows:
                        return "taken"
                    return "aborted" if rows[0]["abort_requested"] else "retried"
                except procrastinate_exceptions.UniqueViolation:
                    # A fresh job holds the queueing lock and will do the same work: it
                    # owes no give-up.
                    status_now, outcome, owes = jobs.Status.FAILED, "superseded", None
            else:
                status_now, outcome, owes = status, "finished", owed_reason
            delete_job = {
                jobs.DeleteJobCondition.ALWAYS: True,
                jobs.DeleteJobCondition.NEVER: False,
                jobs.DeleteJobCondition.SUCCESSFUL: status_now == jobs.Status.SUCCEEDED,
            }[self.delete_jobs]
            rows = await connector.execute_query_all_async(
                queries["finish_job_fenced"],
                job_id=job.id,
                worker_id=self.worker_id,
                attempts=job.attempts,
                status=status_now.value,
                delete_job=delete_job,
                owed_reason=owes,
            )
            return outcome if rows else "taken"

        try:
            outcome = await self._with_retries(f"saving the outcome of job {job.id}", persist)
        finally:
            self._job_ids_to_abort.pop(job.id, None)
        gave_up = outcome == "finished" and owed_reason is not None
        if gave_up or (outcome == "aborted" and owes_hook):
            await self._settle(job)
        elif outcome == "taken":
            logger.warning(
                "job %s (%s) is no longer this worker's (recovered elsewhere, ended as timed "
                "out, or already saved before the connection dropped); this run's outcome "
                "(%s) is not saved",
                job.id,
                job.task_name,
                status.value,
            )
        elif outcome == "superseded":
            logger.warning(
                "job %s (%s) could not be retried: a waiting job holds its queueing lock %r "
                "and does the same work; this one is marked failed",
                job.id,
                job.task_name,
                job.queueing_lock,
            )

    async def _settle(self, job: jobs.Job) -> None:
        """The job's last attempt is saved as failed, owing its give-up hook: run it now,
        in the give-up hooks' thread (a failing hook is logged; the domain's resume sweep is
        the net). Should that not happen (this worker dies, or the database goes away),
        the owed row stays, and the next maintenance run of any worker runs the hook."""
        try:
            await self._in_hooks_thread(functools.partial(giveup.settle_owed, job_id=job.id))
        except Exception:
            logger.exception(
                "could not run the give-up hook of job %s now; maintenance will", job.id
            )

    # -- shutdown ----------------------------------------------------------------------

    async def _shutdown(self, side_tasks: list[asyncio.Task[Any]]) -> None:
        # As procrastinate's _shutdown, except that the heartbeat goes on until the last
        # job has ended: a draining worker must not look dead.
        heartbeat = [t for t in side_tasks if t.get_name() == "update_heartbeats"]
        await utils.cancel_and_capture_errors([t for t in side_tasks if t not in heartbeat])
        now = time.time()
        for context in self._running_jobs.values():
            self.logger.info(
                f"Waiting for job to finish: worker: {context.job.call_string} "
                f"(started {now - context.start_timestamp:.3f} s ago)",
                extra=self._log_extra(action="ending_job", context=None, job_result=None),
            )
        if self._running_jobs:
            await asyncio.wait(self._running_jobs, timeout=self.shutdown_graceful_timeout)
        if self._running_jobs:
            self.logger.info(
                f"{len(self._running_jobs)} jobs still running after graceful timeout. "
                "Aborting them (sync jobs run to their end)",
                extra=self._log_extra(action="stop_worker", context=None, job_result=None),
            )
            await self._abort_running_jobs()
        await utils.cancel_and_capture_errors(heartbeat)
        if self._gave_up is None and self.worker_id is not None:
            try:
                await self.app.job_manager.unregister_worker(self.worker_id)
            except procrastinate_exceptions.ConnectorException as exc:
                logger.warning(
                    "could not unregister worker %s (%s); it will be pruned",
                    self.worker_id,
                    describe(exc),
                )
        self._last_worker_id = self.worker_id
        self.worker_id = None
        self.logger.info(
            f"Stopped worker on {utils.queues_display(self.queues)}",
            extra=self._log_extra(
                action="stop_worker", queues=self.queues, context=None, job_result=None
            ),
        )


class _ReportingDeferrer(periodic.PeriodicDeferrer):
    """procrastinate's periodic deferrer, telling the worker each time a round of defers
    went through: that ends its failure streak (it would otherwise grow across faults
    hours apart, until the outage window stopped a worker whose database answers)."""

    def __init__(self, *, on_success: Callable[[], None], **kwargs: Any):
        super().__init__(**kwargs)
        self._on_success = on_success

    async def defer_jobs(self, jobs_to_defer: Any) -> None:
        await super().defer_jobs(jobs_to_defer)
        self._on_success()


def install(app: Any) -> None:
    """``PROCRASTINATE_ON_APP_READY``: make procrastinate build a :class:`PgstageWorker`
    wherever it builds a worker (its ``worker`` command, ``app.run_worker``), fetching by
    task name (:class:`TaskNameJobManager`), on the worker's connector
    (:func:`queueing.connector.worker_connector`: one round trip per statement) wherever
    procrastinate asks the Django app for one (its ``procrastinate`` command)."""

    def build_worker(**kwargs: Any) -> PgstageWorker:
        return PgstageWorker(app=app, **{**app.worker_defaults, **kwargs})

    fetch_by_task_name(app)
    app._worker = build_worker
    if isinstance(app.connector, DjangoConnector):
        # an instance attribute over procrastinate's method: its public hook for this
        app.connector.get_worker_connector = functools.partial(  # type: ignore[method-assign]
            worker_connector, app.connector.alias
        )
