"""The nemesis: faults drawn at random from a seed, each recorded ``invoke`` → ``ok``.

At most ``overlap`` faults run at once (each in a thread of its own), so faults combine:
a partition during a rolling deploy, a sweep right after an outage. Faults on the
database itself (restart, refusal) never overlap each other, and a worker is the target
of one fault at a time. Durations are the issue's ranges times ``scale`` (at least 1 s).

Kinds (:data:`KINDS`):

- ``kill`` / ``term``: SIGKILL or SIGTERM a worker, then start it again;
- ``deploy``: a rolling deploy — its migration first (:data:`MIGRATIONS`: it changes the
  type of a column the workers' prepared fetch returns), then, :data:`MIGRATION_LEAD`
  later, one worker after the other is drained (SIGTERM) and started in the other
  release (old → new; once all are new, back to the old one);
- ``reconfigure``: a settings change rolled out as a deploy is (each worker it changes
  drained and started again in turn, no migration): each worker's outage window
  (``QUEUEING_DATABASE_OUTAGE_SECONDS``) drawn, the default 300 s or a short one
  (:func:`short_outage_window`), as a canary or a roll-out stopped half-way leaves them
  until the next change. While the windows differ, a worker of the short one prunes, at
  its start, the rows of workers silent for its window plus four stall thresholds, which
  a worker of the long window, cut off that long, outlives: it must register again and
  keep its running jobs fenced;
- ``pg_restart``: a fast restart of PostgreSQL;
- ``pg_crash``: an immediate shutdown of PostgreSQL (a crash: no checkpoint, the
  unflushed tail of the log lost, with it a claims-first fetch not yet flushed) and its
  start (crash recovery);
- ``pg_down``: PostgreSQL stopped (refusing connections) for 1 to 150 s; after it and
  after a restart, half the time, an operator's sweep (``sweep stalled_jobs`` or
  ``sweep --all``) 0 to 5 s after the database returned, as operators do;
- ``terminate``: a storm of ``pg_terminate_backend`` on the workers' sessions, every
  0.5 s for 3 to 30 s;
- ``partition``: one worker's proxy stops forwarding (half-open) for 5 to 120 s;
- ``reset``: one worker's proxy resets every connection;
- ``operator``: ``sweep stalled_jobs``, ``sweep --all``, ``retry_analysis``, a cancel,
  ``replay_stage`` and ``replay_stage --force --cascade``;
- ``statement_timeout``: a table the workers write is locked for 1 to 8 s, so their
  statements hit the statement timeout (``cluster.STATEMENT_TIMEOUT_MS``).
"""

from __future__ import annotations

import io
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import django.db
import psycopg
from django.core.management import call_command

from tests.acceptance.private_pg import PrivateServer
from tests.nemesis.cluster import (
    DEFAULT_OUTAGE_WINDOW,
    OUTAGE_WINDOW_SETTING,
    WORKER_APP,
    Cluster,
    Worker,
)
from tests.nemesis.history import History

KINDS = (
    "kill",
    "term",
    "deploy",
    "reconfigure",
    "pg_restart",
    "pg_down",
    "terminate",
    "partition",
    "reset",
    "operator",
    "statement_timeout",
    "pg_crash",
)
DATABASE_KINDS = {"pg_restart", "pg_down", "pg_crash"}
LOCKED_TABLES = ("pipeline_runs", "analysis_jobs", "credit_ledger", "procrastinate_jobs")
#: Each release's migration, run as a deploy to it begins: the new one widens a column
#: procrastinate's fetch returns, the old one (a rollback) narrows it again. Every worker
#: still running has its fetch prepared against the other type.
MIGRATIONS = {
    "new": "ALTER TABLE procrastinate_jobs ALTER COLUMN attempts TYPE bigint",
    "old": "ALTER TABLE procrastinate_jobs ALTER COLUMN attempts TYPE integer",
}
#: Seconds between a deploy's migration and its first drained worker (no draw: a replay
#: of an older seed meets the same faults).
MIGRATION_LEAD = 3.0


def short_outage_window(scale: float) -> float:
    """The short outage window of a ``reconfigure``: longer than every fault that leaves
    the database reachable yet failing (a table locked up to 8 s, a storm of terminated
    sessions up to 30 s times ``scale``), where a worker of that window would rightly give
    up; shorter than the long partitions and refusals (up to 120 and 150 s times
    ``scale``), which a worker of the default window outlives."""
    return max(12.0, round(35 * scale, 1))


@dataclass(frozen=True, kw_only=True)
class NemesisConfig:
    kinds: tuple[str, ...] = KINDS
    #: Durations are the issue's ranges times this (a short run scales them down).
    scale: float = 0.1
    #: Pause between two faults, seconds (uniform).
    pause: tuple[float, float] = (1.0, 6.0)
    overlap: int = 2
    weights: dict[str, float] = field(default_factory=dict)


class Nemesis:
    def __init__(
        self,
        *,
        cluster: Cluster,
        server: PrivateServer,
        history: History,
        rng: random.Random,
        config: NemesisConfig,
    ) -> None:
        self.cluster = cluster
        self.server = server
        self.history = history
        self.rng = rng
        self.config = config
        self.stop = threading.Event()
        #: Set when the runner tears the cluster down (stopped from outside): a fault no
        #: longer starts the server again, nor waits out its outage.
        self.closing = threading.Event()
        #: Held while the server is stopped or started, so that the teardown's last stop
        #: comes after any start a fault had begun.
        self.database_lock = threading.Lock()
        self._busy: set[str] = set()
        self._busy_lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._run, daemon=True, name="nemesis")
        self.target_release = "new"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """The teardown: stop drawing faults, end a running outage without starting the
        server again, and wait for a start already under way."""
        self.stop.set()
        self.closing.set()
        with self.database_lock:
            pass

    def join(self) -> None:
        """Stop drawing faults; wait for the running ones to end (they heal what they did)."""
        self.stop.set()
        self._thread.join(timeout=600)
        for thread in self._threads:
            thread.join(timeout=600)

    def roll_forward(self) -> None:
        """A deploy to the new release when no worker runs it (the last deploy rolled back):
        the jobs of the task only the new release has wait for a worker that has it
        (docs/deploy.md), and must run once one arrives. Recorded as a deploy fault."""
        if any(worker.release == "new" for worker in self.cluster.workers):
            return
        self.target_release = "new"
        pauses = [1.0 for _ in self.cluster.workers]
        self._fault(
            "deploy", set(), {"to": "new", "after_run": True}, lambda: self._deploy("new", pauses)
        )

    def force_outage(self, at: float, seconds: float) -> None:
        """A refusal of ``seconds``, ``at`` seconds from now, besides the drawn faults
        (the runner's ``--outage``): skipped if a drawn database fault holds the server."""

        def later() -> None:
            if self.stop.wait(at) or not self._claim({"database"}):
                return
            fields = {"seconds": seconds, "reaction": None, "forced": True}
            self._fault("pg_down", {"database"}, fields, lambda: self._database_away(seconds, None))

        thread = threading.Thread(target=later, daemon=True, name="forced-outage")
        self._threads.append(thread)
        thread.start()

    def _duration(self, low: float, high: float) -> float:
        return max(1.0, round(self.rng.uniform(low, high) * self.config.scale, 2))

    def _run(self) -> None:
        kinds = list(self.config.kinds)
        weights = [self.config.weights.get(kind, 1.0) for kind in kinds]
        while not self.stop.wait(self.rng.uniform(*self.config.pause)):
            self._threads = [t for t in self._threads if t.is_alive()]
            # Drawn even when no fault can start now, so that the seed alone decides the
            # sequence of draws: a replay meets the same faults wherever the timing allows.
            kind = self.rng.choices(kinds, weights)[0]
            planned = self._plan(kind, start=len(self._threads) < self.config.overlap)
            if planned is None:
                continue
            resources, fields, action = planned
            thread = threading.Thread(
                target=self._fault, args=(kind, resources, fields, action), daemon=True
            )
            self._threads.append(thread)
            thread.start()
        django.db.connections.close_all()

    def _claim(self, resources: set[str]) -> bool:
        with self._busy_lock:
            if resources & self._busy:
                return False
            self._busy |= resources
            return True

    def _fault(
        self, kind: str, resources: set[str], fields: dict[str, Any], action: Callable[[], Any]
    ) -> None:
        fault_id = self.history.next_id()
        self.history.record("fault", kind=kind, id=fault_id, phase="invoke", **fields)
        try:
            value = action()
        except Exception as exc:
            self.history.record("fault", kind=kind, id=fault_id, phase="info", error=repr(exc))
        else:
            self.history.record("fault", kind=kind, id=fault_id, phase="ok", value=value)
        finally:
            django.db.connections.close_all()
            with self._busy_lock:
                self._busy -= resources

    def _plan(
        self, kind: str, *, start: bool = True
    ) -> tuple[set[str], dict[str, Any], Callable[[], Any]] | None:
        """The fault's resources, its recorded parameters and its action (all drawn now,
        in the nemesis thread, so the seed decides them); None when its targets are busy
        or ``start`` is false (the draws are made all the same)."""
        workers = self.cluster.workers
        if kind in ("kill", "term", "partition", "reset"):
            worker = self.rng.choice(workers)
            resources = {f"worker-{worker.index}"}
            if kind == "partition":
                seconds = self._duration(5, 120)
                fields = {"worker": worker.index, "seconds": seconds}
                action = lambda: self._partition(worker, seconds)  # noqa: E731
            elif kind == "reset":
                fields = {"worker": worker.index}
                action = lambda: {"connections": worker.proxy.reset()}  # noqa: E731
            else:
                sig = signal.SIGKILL if kind == "kill" else signal.SIGTERM
                pause = round(self.rng.uniform(0, 3), 2)
                fields = {"worker": worker.index, "pid": worker.pid, "restart_after": pause}
                action = lambda: self._signal(worker, sig, pause)  # noqa: E731
        elif kind == "deploy":
            resources = {f"worker-{w.index}" for w in workers}
            if all(w.release == self.target_release for w in workers):
                self.target_release = "old" if self.target_release == "new" else "new"
            target = self.target_release
            pauses = [round(self.rng.uniform(0.5, 3), 2) for _ in workers]
            fields = {"to": target}
            action = lambda: self._deploy(target, pauses)  # noqa: E731
        elif kind == "reconfigure":
            resources = {f"worker-{w.index}" for w in workers}
            short = short_outage_window(self.config.scale)
            # Each worker's window drawn: a canary, or a roll-out stopped half-way, leaves
            # the workers on different windows until the next change.
            windows = [short if self.rng.random() < 0.5 else None for _ in workers]
            pauses = [round(self.rng.uniform(0.5, 3), 2) for _ in workers]
            fields = {"outage_windows": windows}
            action = lambda: self._reconfigure(windows, pauses)  # noqa: E731
        elif kind in DATABASE_KINDS:
            resources = {"database"}
            seconds = 0.0 if kind in ("pg_restart", "pg_crash") else self._duration(1, 150)
            # Half the time an operator reacts to the outage with a sweep, 0 to 5 s after.
            reaction = None
            if self.rng.random() < 0.5:
                reaction = (
                    self.rng.choice(["sweep_stalled", "sweep_all"]),
                    round(self.rng.uniform(0, 5), 2),
                )
            fields = {"seconds": seconds, "reaction": reaction}
            crash = kind == "pg_crash"
            action = lambda: self._database_away(seconds, reaction, crash=crash)  # noqa: E731
        elif kind == "terminate":
            resources = {"terminate"}
            seconds = self._duration(3, 30)
            fields = {"seconds": seconds}
            action = lambda: self._storm(seconds)  # noqa: E731
        elif kind == "statement_timeout":
            table = self.rng.choice(LOCKED_TABLES)
            resources = {f"lock-{table}"}
            seconds = round(self.rng.uniform(1, 8), 2)
            fields = {"table": table, "seconds": seconds}
            action = lambda: self._lock_table(table, seconds)  # noqa: E731
        elif kind == "operator":
            name = self.rng.choice(
                ["sweep_stalled", "sweep_all", "retry", "cancel", "replay", "replay_force"]
            )
            resources = {f"operator-{name}"}
            pick = self.rng.random()
            fields = {"action": name}
            action = lambda: self._operator(name, pick)  # noqa: E731
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        if not start or not self._claim(resources):
            return None
        return resources, fields, action

    def _signal(self, worker: Worker, sig: int, pause: float) -> dict[str, Any]:
        with worker.lock:
            stopped = worker.pid
            code = self.cluster.stop(worker, sig)
        time.sleep(pause)
        with worker.lock:
            self.cluster.start(worker)
        return {"code": code, "stopped": stopped, "started": worker.pid}

    def _deploy(self, release: str, pauses: list[float]) -> dict[str, Any]:
        """Drain each worker in turn and start it in ``release`` (a rolling deploy), pausing
        after each as ``pauses`` says."""
        began = time.monotonic()
        migration = self._migrate(release)
        migration_seconds = round(time.monotonic() - began, 3)
        time.sleep(MIGRATION_LEAD)

        def to_release(worker: Worker) -> Callable[[], None] | None:
            if worker.release == release:
                return None
            return lambda: setattr(worker, "release", release)

        rolled = self._roll(to_release, pauses)
        return {"migration": migration, "migration_seconds": migration_seconds, "rolled": rolled}

    def _reconfigure(self, windows: list[float | None], pauses: list[float]) -> dict[str, Any]:
        """Roll each worker's outage window of ``windows`` (None: the default) out to it,
        one worker after the other, as a settings change is deployed."""
        wanted = {
            worker.index: window
            for worker, window in zip(self.cluster.workers, windows, strict=True)
        }

        def to_window(worker: Worker) -> Callable[[], None] | None:
            window = wanted[worker.index]
            if worker.outage_window == (window or DEFAULT_OUTAGE_WINDOW):
                return None
            if window is None:
                return lambda: worker.settings.pop(OUTAGE_WINDOW_SETTING, None)
            return lambda: worker.settings.update({OUTAGE_WINDOW_SETTING: f"{window:g}"})

        return {"rolled": self._roll(to_window, pauses)}

    def _roll(
        self, change: Callable[[Worker], Callable[[], object] | None], pauses: list[float]
    ) -> list[dict[str, Any]]:
        """One worker after the other, each that ``change`` changes: drained (SIGTERM),
        changed (what ``change`` returned, called once it stopped) and started again;
        pausing after each as ``pauses`` says."""
        rolled = []
        for worker, pause in zip(self.cluster.workers, pauses, strict=True):
            apply = change(worker)
            if apply is None:
                continue
            with worker.lock:
                stopped = worker.pid
                code = self.cluster.stop(worker, signal.SIGTERM)
                apply()
                self.cluster.start(worker)
            rolled.append(
                {"worker": worker.index, "code": code, "stopped": stopped, "started": worker.pid}
            )
            time.sleep(pause)
        return rolled

    def _migrate(self, release: str) -> str:
        """``release``'s migration (:data:`MIGRATIONS`), as its deploy runs it: done, or why
        not (the database away, or the table's lock not had within 10 s)."""
        try:
            with psycopg.connect(self.server.url, autocommit=True, connect_timeout=3) as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute(MIGRATIONS[release])
        except psycopg.Error as exc:
            return f"not run: {type(exc).__name__}: {str(exc).strip()[:200]}"
        return "done"

    def _partition(self, worker: Worker, seconds: float) -> None:
        worker.proxy.partition()
        try:
            time.sleep(seconds)
        finally:
            worker.proxy.heal()

    def _database_away(
        self, seconds: float, reaction: tuple[str, float] | None, *, crash: bool = False
    ) -> None:
        """A fast shutdown (every session ends; ``crash``: an immediate one, as a crash),
        ``seconds`` refusing connections, start;
        then, when ``reaction`` says so, an operator's sweep that many seconds later. Once
        the runner tears down (``closing``), the outage ends at once and the server is not
        started again."""
        with self.database_lock:
            if self.closing.is_set():
                return
            if crash:
                self.server.crash()
            else:
                self.server.stop()
        stopped = time.monotonic()
        self.history.record("database", event="down")
        try:
            self.closing.wait(seconds)
        finally:
            with self.database_lock:
                if not self.closing.is_set():
                    self.server.start()
        if self.closing.is_set():
            return  # torn down: the server stays down
        self.history.record("database", event="up", after=time.monotonic() - stopped)
        if reaction is not None:
            name, pause = reaction
            time.sleep(pause)
            self._fault(
                "operator",
                set(),
                {"action": name, "after_outage": True},
                lambda: self._operator(name, 0.0),
            )

    def _storm(self, seconds: float) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        terminated = 0
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.server.url, autocommit=True, connect_timeout=3) as conn:
                    rows = conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s",
                        [WORKER_APP],
                    ).fetchall()
                    terminated += len(rows)
            except psycopg.Error:
                pass
            time.sleep(0.5)
        return {"terminated": terminated}

    def _lock_table(self, table: str, seconds: float) -> None:
        with psycopg.connect(self.server.url, connect_timeout=3) as conn:
            conn.execute("SET lock_timeout = '5s'")
            conn.execute(f'LOCK TABLE "{table}" IN EXCLUSIVE MODE')
            time.sleep(seconds)
            conn.rollback()

    def _operator(self, name: str, pick: float) -> dict[str, Any]:
        """An operator's action, through the same command or service an operator uses."""
        out = io.StringIO()
        if name == "sweep_stalled":
            call_command("sweep", "stalled_jobs", stdout=out)
        elif name == "sweep_all":
            call_command("sweep", "--all", stdout=out)
        elif name == "retry":
            job_id = _pick(pick, "SELECT id FROM analysis_jobs WHERE status = 'failed'")
            if job_id is None:
                return {"skipped": "no failed analysis"}
            call_command("retry_analysis", "--job", str(job_id), stdout=out)
        elif name == "cancel":
            return self._cancel(pick)
        else:
            row = _pick_row(
                pick,
                "SELECT t.slug, r.anfrage_id, r.stage FROM pipeline_runs r "
                "JOIN tenants t ON t.id = r.tenant_id "
                + ("WHERE r.status = 'success'" if name == "replay_force" else ""),
            )
            if row is None:
                return {"skipped": "no stage"}
            slug, anfrage_id, stage = row
            extra = ["--force", "--cascade"] if name == "replay_force" else []
            args = ["--tenant", slug, "--anfrage", str(anfrage_id), "--stage", stage, *extra]
            call_command("replay_stage", *args, stdout=out)
            return {"args": args, "out": out.getvalue()[-500:]}
        return {"out": out.getvalue()[-500:]}

    def _cancel(self, pick: float) -> dict[str, Any]:
        """Cancel a waiting generic job with a hook (the job admin's action) or a queued
        analysis (the runs admin's), whichever the draw names."""
        from queueing.jobs import job_cancel
        from runs.admission import analysis_job_cancel
        from tests.nemesis.tasks import SETTLED

        if pick < 0.5:
            job_id = _pick(
                pick * 2,
                "SELECT id FROM procrastinate_jobs WHERE status = 'todo' AND task_name = %s",
                [SETTLED],
            )
            if job_id is None:
                return {"skipped": "no waiting job"}
            return {"job": job_id, "cancelled": job_cancel(job_id=job_id, actor="nemesis")}
        job_id = _pick(pick * 2 - 1, "SELECT id FROM analysis_jobs WHERE status = 'queued'")
        if job_id is None:
            return {"skipped": "no queued analysis"}
        return {"analysis": job_id, "cancelled": analysis_job_cancel(job_id=job_id)}


def _pick_row(pick: float, sql: str, params: list[Any] | None = None) -> tuple | None:
    """The row at fraction ``pick`` of ``sql``'s rows ordered by their first column."""
    with django.db.connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM ({sql}) AS candidates ORDER BY 1", params or [])
        rows = cursor.fetchall()
    return rows[min(int(pick * len(rows)), len(rows) - 1)] if rows else None


def _pick(pick: float, sql: str, params: list[Any] | None = None) -> int | None:
    row = _pick_row(pick, sql, params)
    return None if row is None else row[0]
