"""The nemesis cluster: a private PostgreSQL on TCP, and worker processes of two releases,
each behind a proxy of its own (:mod:`tests.nemesis.proxy`).

A release is a set of task modules (``PGSTAGE_TASK_MODULES``): ``old`` has the project's
tasks and the generic nemesis tasks; ``new`` adds :mod:`tests.nemesis.tasks_new`. A worker
may also run settings of its own (``Worker.settings``: a settings change rolled out one
worker at a time, :data:`OUTAGE_WINDOW_SETTING`). A worker's exits are watched: one the
nemesis did not cause is recorded, and the worker is started again as its supervisor
would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.nemesis.history import History
from tests.nemesis.proxy import Proxy, ProxyLoop

ROOT = Path(__file__).resolve().parent.parent.parent
WORKER_APP = "nemesis-worker"
RELEASES = {
    "old": "tests.nemesis.tasks",
    "new": "tests.nemesis.tasks,tests.nemesis.tasks_new",
}

#: The workers' clocks (short, so that a run of minutes sees recoveries): beat every 1 s,
#: dead after 5 s of silence, recovery every 1.2 s (queueing.E003 allows at most half of
#: 5 s less 1.5 heartbeats less the 1 s liveness bound), leases and grace windows of
#: seconds, quick retries.
WORKER_SETTINGS = {
    "WORKER_HEARTBEAT_SECONDS": "1",
    "STALLED_WORKER_SECONDS": "5",
    "STALLED_RECOVERY_SECONDS": "1.2",
    "STALLED_JOB_MAX_RECOVERIES": "3",
    "WORKER_POLLING_SECONDS": "2",
    "WORKER_GRACEFUL_TIMEOUT_SECONDS": "20",
    "RETRY_BASE_SECONDS": "0.5",
    "RETRY_CAP_SECONDS": "5",
    "SWEEP_GRACE_SECONDS": "5",
    "PIPELINE_RESUME_GRACE_SECONDS": "5",
    "PIPELINE_LEASE_SECONDS": "30",
    "MAX_INQUIRIES_PER_TENANT_PER_HOUR": "100000",
    "MAX_QUEUED_ANALYSES_PER_USER": "1000",
    "CORE_DAILY_BUDGET": "100000",
}
#: The environment variable of ``QUEUEING_DATABASE_OUTAGE_SECONDS`` (config/settings.py), and
#: its default: how long a worker rides out the database's absence before it exits; a
#: worker prunes, at its start, the rows of workers silent for that plus four stall
#: thresholds (``queueing.worker.prune_after_seconds``).
OUTAGE_WINDOW_SETTING = "DATABASE_OUTAGE_SECONDS"
DEFAULT_OUTAGE_WINDOW = 300.0
#: Every worker session runs with a statement timeout (docs/reliability.md recommends one).
STATEMENT_TIMEOUT_MS = 2000
CONCURRENCY = 2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Worker:
    index: int
    release: str
    proxy: Proxy
    #: Settings of its own, over :data:`WORKER_SETTINGS` (environment variables).
    settings: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    generation: int = 0
    #: Set while the nemesis stops it on purpose (its exit is expected).
    stopping: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    @property
    def outage_window(self) -> float:
        return float(self.settings.get(OUTAGE_WINDOW_SETTING, DEFAULT_OUTAGE_WINDOW))

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Cluster:
    """The workers and their proxies, over ``database_port`` (the server's own port)."""

    def __init__(
        self,
        *,
        database_port: int,
        run_dir: Path,
        history: History,
        releases: list[str],
    ) -> None:
        self.run_dir = run_dir
        self.history = history
        self.effects_dir = run_dir / "effects"
        self.effects_dir.mkdir(parents=True, exist_ok=True)
        self.loop = ProxyLoop()
        self.workers: list[Worker] = []
        for index, release in enumerate(releases):
            proxy = Proxy(self.loop, upstream_port=database_port, name=f"proxy-{index}")
            proxy.start()
            self.workers.append(Worker(index=index, release=release, proxy=proxy))
        self.closed = False
        self._watching = threading.Event()
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="supervisor")

    def env(self, worker: Worker) -> dict[str, str]:
        return {
            **os.environ,
            **WORKER_SETTINGS,
            # Always the window the start line records (not one the shell or .env sets).
            OUTAGE_WINDOW_SETTING: f"{DEFAULT_OUTAGE_WINDOW:g}",
            **worker.settings,
            "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{worker.proxy.port}/pgstage",
            "PGAPPNAME": WORKER_APP,
            "PGOPTIONS": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
            "PGSTAGE_TASK_MODULES": RELEASES[worker.release],
            "NEMESIS_EFFECTS_DIR": str(self.effects_dir),
            "WORKER_STATE_DIR": str(self.run_dir / "worker-state"),
            "PYTHONUNBUFFERED": "1",
            "LOG_LEVEL": "INFO",
            "PROCRASTINATE_LOG_LEVEL": "INFO",
            # The checker reads the failed fetches back from these lines (worker_logs).
            "LOG_FORMAT": "plain",
        }

    def start(self, worker: Worker) -> None:
        """Start ``worker`` (a new process of its release); nothing once shut down (a fault
        still running then must not leave a worker behind)."""
        if self.closed:
            return
        worker.generation += 1
        log = self.run_dir / f"worker-{worker.index}.{worker.generation}.log"
        handle = open(log, "w")  # noqa: SIM115 - the child holds it
        worker.process = subprocess.Popen(
            [
                sys.executable,
                "manage.py",
                "procrastinate",
                "worker",
                f"--concurrency={CONCURRENCY}",
                f"--name=nemesis-{worker.index}",
            ],
            cwd=ROOT,
            env=self.env(worker),
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        worker.stopping = False
        self.history.record(
            "worker",
            event="start",
            worker=worker.index,
            pid=worker.pid,
            release=worker.release,
            outage_window=worker.outage_window,
            log=str(log),
        )

    def start_all(self) -> None:
        for worker in self.workers:
            self.start(worker)
        self._watching.set()
        self._watcher.start()

    def stop(self, worker: Worker, sig: int, *, timeout: float = 60) -> int | None:
        """Send ``sig`` and wait for the exit (SIGKILL after ``timeout``); the exit status."""
        process = worker.process
        if process is None or process.poll() is not None:
            return None if process is None else process.returncode
        worker.stopping = True
        # From here a SIGTERM'd worker drains: it fetches nothing (the checker's L2).
        self.history.record(
            "worker",
            event="signal",
            worker=worker.index,
            pid=process.pid,
            signal=signal.Signals(sig).name,
        )
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            code = process.wait(timeout=10)
            self.history.record(
                "worker", event="stop_timeout", worker=worker.index, pid=process.pid
            )
        self.history.record(
            "worker",
            event="exit",
            worker=worker.index,
            pid=process.pid,
            code=code,
            expected=True,
            signal=signal.Signals(sig).name,
        )
        return code

    def _watch(self) -> None:
        """A supervisor: a worker that exits on its own is recorded and started again."""
        while self._watching.is_set():
            for worker in self.workers:
                with worker.lock:
                    process = worker.process
                    if worker.stopping or process is None or process.poll() is None:
                        continue
                    self.history.record(
                        "worker",
                        event="exit",
                        worker=worker.index,
                        pid=process.pid,
                        code=process.returncode,
                        expected=False,
                    )
                    self.start(worker)
            time.sleep(0.2)

    def shutdown(self, *, grace: float = 30) -> None:
        """Stop every worker (SIGTERM; SIGKILL to those still running ``grace`` seconds
        later, one deadline for all) and the proxies. A teardown from outside (the runner
        stopped by a signal) uses a short grace: a worker draining through an outage
        would otherwise hold it for its whole graceful timeout."""
        self.closed = True
        self._watching.clear()
        if self._watcher.is_alive():
            self._watcher.join(timeout=5)
        for worker in self.workers:
            if worker.proxy.partitioned:
                worker.proxy.heal()
        for worker in self.workers:
            if worker.alive:
                worker.stopping = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for worker in self.workers:
            if worker.process is None:
                continue
            try:
                worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait(timeout=10)
        for worker in self.workers:
            worker.proxy.close()
        self.loop.stop()
