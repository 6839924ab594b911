"""The pgstage worker: procrastinate's ``Worker``, hardened for the faults production meets.

``manage.py procrastinate worker`` runs it (``install`` is procrastinate's
``PROCRASTINATE_ON_APP_READY`` hook), so operators keep procrastinate's own command.

What it adds to procrastinate's worker (3.10), each proven by a test that fails without it:

* **A draining worker keeps heart-beating.** procrastinate cancels the heartbeat as soon as
  SIGTERM arrives, while its jobs run on (sync jobs to completion, whatever the graceful
  timeout); a stall threshold shorter than the drain then re-runs them on another worker.
  Here the heartbeat stops only after the last job has ended.
* **It rides out the database going away** — terminated connections, a restart, a
  failover. procrastinate's worker exits on the first database error in any of its loops.
  Here each loop (fetch, heartbeat, LISTEN, periodic deferrer, persisting a job's outcome)
  retries with capped, fully jittered backoff and logs one line per attempt with its next
  delay. LISTEN is established again on a fresh connection, followed by one poll at once,
  so jobs enqueued during the outage start within LISTEN latency. While the database stays
  away longer than ``outage_seconds`` the worker stops taking jobs and exits non-zero with
  a clear message, for its supervisor.
* **A job's outcome is never dropped, and never written over another worker's run.**
  Persisting it is retried until the database is back, and it is fenced on the worker:
  a job that stalled recovery took back meanwhile (because this worker looked dead) is
  left to its new run. A retry whose queueing lock a fresh job holds (procrastinate
  issues 1446/1543) ends ``failed`` as superseded instead of staying ``doing`` for ever.
* **Its row survives an outage.** Only workers silent far longer than any live one can be
  are pruned (silence counted from the server's start too), and a worker whose row went
  missing registers again and takes back its running jobs.
* **Jobs that fail for good settle their domain.** The give-up middleware runs the task's
  ``on_give_up`` hook (``queueing.app.task``) when the task's retry strategy has no retry
  left, so a domain row never stays active behind a failed job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from procrastinate import exceptions as procrastinate_exceptions
from procrastinate import jobs, periodic, retry, utils
from procrastinate import worker as procrastinate_worker
from procrastinate.job_context import JobContext, JobResult

from queueing import backoff
from queueing.giveup import give_up_middleware
from queueing.sql import load

logger = logging.getLogger(__name__)
queries = load("queueing", "worker.sql")

#: Backoff between attempts while the database is away: full jitter up to the cap.
RECONNECT_BASE_SECONDS = 0.5
RECONNECT_CAP_SECONDS = 10.0
#: How often the LISTEN connection proves it is alive when no notification comes.
LISTEN_KEEPALIVE_SECONDS = 30.0
#: How long a loop waits for a pooled connection before it counts as a failed attempt.
POOL_TIMEOUT_SECONDS = 5.0


class DatabaseUnavailable(procrastinate_exceptions.ProcrastinateException):
    """The database stayed unreachable for longer than the worker's outage window: the
    worker stopped so that its supervisor (systemd, compose, ``make run``) restarts it."""


def outage_seconds() -> float:
    return float(getattr(settings, "QUEUEING_DATABASE_OUTAGE_SECONDS", 300))


def heartbeat_seconds() -> float:
    return float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10))


def stalled_seconds() -> float:
    return float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30))


def prune_after_seconds() -> float:
    """A worker silent this long is dead for certain: it would have exited after its
    outage window. Its row may go; its jobs are recovered long before."""
    return outage_seconds() + 4 * stalled_seconds()


class Outage:
    """One stretch of database trouble, shared by the worker's loops: when it began, and
    whether it has lasted past the window."""

    def __init__(self, *, window: float, on_expired: Callable[[str], None]):
        self.window = window
        self.started: float | None = None
        self._on_expired = on_expired
        self.expired = False

    def failed(self, what: str, exc: BaseException, *, attempt: int, rng: random.Random) -> float:
        """Record a failed attempt of ``what``; return the delay before the next one."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
        elapsed = now - self.started
        if elapsed >= self.window and not self.expired:
            self.expired = True
            self._on_expired(
                f"the database stayed unreachable for {elapsed:.0f} s (the outage window "
                f"is {self.window:.0f} s, QUEUEING_DATABASE_OUTAGE_SECONDS); last error "
                f"while {what}: {_describe(exc)}"
            )
        pause = backoff.delay(
            attempt, base=RECONNECT_BASE_SECONDS, cap=RECONNECT_CAP_SECONDS, rng=rng
        )
        pause = max(pause, 0.05)
        logger.warning(
            "database unreachable while %s (attempt %d, %.0f s into the outage): %s; "
            "next attempt in %.1f s",
            what,
            attempt + 1,
            elapsed,
            _describe(exc),
            pause,
        )
        return pause

    def recovered(self) -> None:
        if self.started is not None and not self.expired:
            logger.warning("database reachable again after %.1f s", time.monotonic() - self.started)
            self.started = None


def _describe(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


def _is_missing_worker(exc: BaseException) -> bool:
    """A foreign-key violation on ``worker_id``: this worker's row was pruned."""
    cause = exc.__cause__
    return getattr(getattr(cause, "diag", None), "constraint_name", "") == (
        "procrastinate_jobs_worker_id_fkey"
    )


class PgstageWorker(procrastinate_worker.Worker):
    """procrastinate's worker with a drain heartbeat, database-outage resilience, fenced
    outcomes, and give-up hooks (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        middleware = list(kwargs.pop("task_middleware", None) or [])
        kwargs.setdefault("update_heartbeat_interval", heartbeat_seconds())
        super().__init__(*args, task_middleware=[*middleware, give_up_middleware], **kwargs)
        self._rng = random.SystemRandom()
        self._gave_up: str | None = None
        self.outage = Outage(window=outage_seconds(), on_expired=self._give_up)

    # -- the outage window -------------------------------------------------------------

    def _give_up(self, reason: str) -> None:
        logger.error("stopping the worker: %s", reason)
        self._gave_up = reason
        self.stop()

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up at once when the worker is asked to stop."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_event.wait(), timeout=seconds)

    async def _with_retries(self, what: str, call: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``call`` until it succeeds; between failures, back off (one log line per
        attempt). Raises :class:`DatabaseUnavailable` once the outage window is over."""
        attempt = 0
        while True:
            try:
                result = await call()
            except procrastinate_exceptions.ConnectorException as exc:
                pause = self.outage.failed(what, exc, attempt=attempt, rng=self._rng)
                if self._gave_up is not None:
                    raise DatabaseUnavailable(self._gave_up) from exc
                attempt += 1
                await asyncio.sleep(pause)
                continue
            self.outage.recovered()
            return result

    # -- start, register, prune --------------------------------------------------------

    async def run(self) -> None:
        # As procrastinate's run(), with the start-up queries retried (the database may
        # still be coming up) and the prune threshold long enough for an outage.
        self._stop_event.clear()
        connector = self.app.connector
        pruned = await self._with_retries(
            "pruning dead workers",
            lambda: connector.execute_query_all_async(
                queries["prune_dead_workers"], seconds=prune_after_seconds()
            ),
        )
        if pruned:
            logger.info("pruned dead workers: %s", ", ".join(str(r["id"]) for r in pruned))
        self.worker_id = await self._with_retries(
            "registering the worker", self.app.job_manager.register_worker
        )
        # Fail fast when the pool has no live connection to give (its default is 30 s):
        # each loop then backs off and says so, instead of hanging silently.
        pool = getattr(connector, "pool", None)
        if pool is not None:
            pool.timeout = POOL_TIMEOUT_SECONDS
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
        if self._gave_up is not None:
            raise DatabaseUnavailable(self._gave_up)

    async def _register_again(self, old: int | None) -> None:
        """Our row ``old`` is gone (pruned while we were cut off): register anew and take
        back the running jobs that are still ours. The fetch loop and the heartbeat may
        both notice; the second finds the id already changed and does nothing."""
        if self.worker_id != old:
            return
        self.worker_id = await self.app.job_manager.register_worker()
        running = [c.job.id for c in self._running_jobs.values() if c.job.id]
        adopted = await self.app.connector.execute_query_all_async(
            queries["adopt_jobs"], worker_id=self.worker_id, old_worker_id=old, job_ids=running
        )
        lost = sorted(set(running) - {row["id"] for row in adopted})
        logger.warning(
            "worker %s was pruned while cut off from the database; registered again as %s "
            "and took back %d running job(s)%s",
            old,
            self.worker_id,
            len(adopted),
            f"; job(s) {lost} were recovered elsewhere meanwhile" if lost else "",
        )

    # -- the loops ---------------------------------------------------------------------

    async def _fetch_and_process_jobs(self) -> None:
        attempt = 0
        while not self._stop_event.is_set():
            try:
                if attempt:
                    await self._requeue_orphans()
                await super()._fetch_and_process_jobs()
            except procrastinate_exceptions.ConnectorException as exc:
                if _is_missing_worker(exc):
                    await self._with_retries(
                        "registering the worker again",
                        functools.partial(self._register_again, self.worker_id),
                    )
                    continue
                pause = self.outage.failed("fetching jobs", exc, attempt=attempt, rng=self._rng)
                attempt += 1
                await self._pause(pause)
                # A poll at once after the pause, whatever LISTEN said meanwhile.
                continue
            self.outage.recovered()
            return

    async def _requeue_orphans(self) -> None:
        """After a failed fetch: a fetch whose reply was lost may have committed, leaving
        a job 'doing' under this (live, heart-beating) worker that never runs it —
        invisible to stalled recovery. Put such jobs back. Called from the fetch loop
        only, so no fetch is in flight."""
        running = [c.job.id for c in self._running_jobs.values() if c.job.id]
        rows = await self.app.connector.execute_query_all_async(
            queries["requeue_orphans"], worker_id=self.worker_id, running=running
        )
        if rows:
            logger.warning(
                "job(s) %s were fetched by this worker but their fetch's reply was lost; "
                "put back to todo",
                ", ".join(str(r["id"]) for r in rows),
            )

    async def _update_heartbeat(self) -> None:
        attempt = 0
        pause = self.update_heartbeat_interval
        while True:
            await asyncio.sleep(pause)
            try:
                beating = self.worker_id
                rows = await self.app.connector.execute_query_all_async(
                    queries["beat"], worker_id=beating
                )
                if not rows:
                    await self._register_again(beating)
            except procrastinate_exceptions.ConnectorException as exc:
                # Beat again soon after the database returns: a long silence would make
                # this worker look dead and its running jobs would be run elsewhere.
                pause = min(
                    self.update_heartbeat_interval,
                    self.outage.failed("beating", exc, attempt=attempt, rng=self._rng),
                )
                attempt += 1
                continue
            self.outage.recovered()
            attempt, pause = 0, self.update_heartbeat_interval

    async def _periodic_deferrer(self) -> None:
        attempt = 0
        while True:
            deferrer = periodic.PeriodicDeferrer(
                registry=self.app.periodic_registry, **self.app.periodic_defaults
            )
            try:
                return await deferrer.worker()
            except procrastinate_exceptions.ConnectorException as exc:
                pause = self.outage.failed(
                    "deferring periodic jobs", exc, attempt=attempt, rng=self._rng
                )
                attempt += 1
                await asyncio.sleep(pause)

    async def _listen(self) -> None:
        """LISTEN on a session connection of its own; on any failure, connect again with
        backoff. Each time LISTEN is (re)established, poll once at once: notifications
        sent while it was down are lost, their jobs are not."""
        import psycopg
        from procrastinate.contrib.django.utils import connector_params
        from procrastinate.manager import get_channel_for_queues

        channels = list(get_channel_for_queues(queues=self.queues))
        attempt = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **connector_params(), autocommit=True
                ) as connection:
                    for channel in channels:
                        await connection.execute(
                            psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
                        )
                    if attempt:
                        self.outage.recovered()
                        logger.warning("LISTEN established again; polling for jobs now")
                    attempt = 0
                    self._new_job_event.set()
                    while True:
                        async for notify in connection.notifies(timeout=LISTEN_KEEPALIVE_SECONDS):
                            await self._handle_notification(
                                channel=notify.channel, notification=_load(notify.payload)
                            )
                        await connection.execute("SELECT 1")
            except (psycopg.Error, OSError) as exc:
                pause = self.outage.failed(
                    "listening for jobs",
                    procrastinate_exceptions.ConnectorException(str(exc)),
                    attempt=attempt,
                    rng=self._rng,
                )
                attempt += 1
                await asyncio.sleep(pause)

    def _start_side_tasks(self) -> list[asyncio.Task[Any]]:
        side_tasks = [
            asyncio.create_task(self._update_heartbeat(), name="update_heartbeats"),
            asyncio.create_task(self._periodic_deferrer(), name="deferrer"),
            asyncio.create_task(self._poll_jobs_to_abort(), name="poll_jobs_to_abort"),
        ]
        if self.listen_notify:
            side_tasks.append(asyncio.create_task(self._listen(), name="listener"))
        return side_tasks

    # -- a job's outcome ---------------------------------------------------------------

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

        async def persist() -> str:
            if retry_decision is not None:
                try:
                    rows = await connector.execute_query_all_async(
                        queries["retry_job_fenced"],
                        job_id=job.id,
                        worker_id=self.worker_id,
                        retry_at=retry_decision.retry_at or utils.utcnow(),
                        priority=retry_decision.priority,
                        queue=retry_decision.queue,
                        lock=retry_decision.lock,
                    )
                    return "retried" if rows else "taken"
                except procrastinate_exceptions.UniqueViolation:
                    # A fresh job holds the queueing lock and will do the same work.
                    status_now, outcome = jobs.Status.FAILED, "superseded"
            else:
                status_now, outcome = status, "finished"
            delete_job = {
                jobs.DeleteJobCondition.ALWAYS: True,
                jobs.DeleteJobCondition.NEVER: False,
                jobs.DeleteJobCondition.SUCCESSFUL: status_now == jobs.Status.SUCCEEDED,
            }[self.delete_jobs]
            rows = await connector.execute_query_all_async(
                queries["finish_job_fenced"],
                job_id=job.id,
                worker_id=self.worker_id,
                status=status_now.value,
                delete_job=delete_job,
            )
            return outcome if rows else "taken"

        try:
            outcome = await self._with_retries(f"saving the outcome of job {job.id}", persist)
        finally:
            self._job_ids_to_abort.pop(job.id, None)
        if outcome == "taken":
            logger.warning(
                "job %s (%s) was recovered by another worker while this one ran it; "
                "this run's outcome (%s) is discarded",
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
                f"(started {now - context.start_timestamp:.3f} s ago)"
            )
        if self._running_jobs:
            await asyncio.wait(self._running_jobs, timeout=self.shutdown_graceful_timeout)
        if self._running_jobs:
            self.logger.info(
                f"{len(self._running_jobs)} jobs still running after graceful timeout. "
                "Aborting them (sync jobs run to their end)"
            )
            await self._abort_running_jobs()
        await utils.cancel_and_capture_errors(heartbeat)
        if self._gave_up is None:
            try:
                await self.app.job_manager.unregister_worker(self.worker_id)
            except procrastinate_exceptions.ConnectorException as exc:
                logger.warning(
                    "could not unregister worker %s (%s); it will be pruned",
                    self.worker_id,
                    _describe(exc),
                )
        self.worker_id = None
        self.logger.info(f"Stopped worker on {utils.queues_display(self.queues)}")


def _load(payload: str) -> jobs.Notification:
    import json

    return json.loads(payload)


def install(app: Any) -> None:
    """``PROCRASTINATE_ON_APP_READY``: make procrastinate build a :class:`PgstageWorker`
    wherever it builds a worker (its ``worker`` command, ``app.run_worker``)."""

    def build_worker(**kwargs: Any) -> PgstageWorker:
        return PgstageWorker(app=app, **{**app.worker_defaults, **kwargs})

    app._worker = build_worker
