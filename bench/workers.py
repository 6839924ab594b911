"""Real worker processes for the scenarios that run jobs, and the clock they are read by.

A *group* is one side's worker processes (``manage.py procrastinate worker``): the
baseline runs procrastinate's own worker (``bench.plain_settings``), pgstage runs its own
(``config.settings``). Both sides' groups are started together, wait until each process
has its LISTEN session up, run a warm-up batch, and then take batches in turn; an idle
group costs nothing but a heartbeat.

Start-up is never measured: a batch is enqueued in one transaction (all its jobs become
visible at once) and timed from procrastinate's events — the first job's start to the last
job's end, on the database's clock. Each process is named on the server (``PGAPPNAME``),
and its peak RSS is read from the kernel (``VmHWM``) just before it is stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
from django.db import transaction

from bench import database

ROOT = Path(__file__).resolve().parent.parent
SETTINGS = {"plain": "bench.plain_settings", "pgstage": "config.settings"}
#: A queue no worker takes: a counted batch waits here until the counters are read.
PARKED_QUEUE = "bench_parked"
APP_PREFIX = "pgstage-bench"


class BenchError(Exception):
    """A scenario could not measure what it should (a worker died, a job failed)."""


@dataclass(kw_only=True)
class WorkerGroup:
    side: str
    name: str
    queues: tuple[str, ...]
    concurrency: int
    processes: list[subprocess.Popen] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    peak_rss_kib: list[int] = field(default_factory=list)

    @property
    def app_prefix(self) -> str:
        return f"{APP_PREFIX}-{self.name}-"

    def log_tail(self, lines: int = 15) -> str:
        tails = []
        for path in self.logs:
            text = path.read_text(errors="replace") if path.exists() else ""
            tails.append(f"--- {path} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(tails)

    def check_alive(self) -> None:
        for process in self.processes:
            if process.poll() is not None:
                raise BenchError(
                    f"worker group {self.name} lost a process (exit {process.returncode}):\n"
                    + self.log_tail()
                )


@dataclass(frozen=True, kw_only=True)
class GroupSpec:
    side: str
    name: str
    queues: tuple[str, ...]
    processes: int
    concurrency: int
    database_url: str


def _start(spec: GroupSpec, log_dir: Path) -> WorkerGroup:
    group = WorkerGroup(
        side=spec.side, name=spec.name, queues=spec.queues, concurrency=spec.concurrency
    )
    for index in range(spec.processes):
        log = log_dir / f"{spec.name}-{index}.log"
        env = {
            **os.environ,
            "DATABASE_URL": spec.database_url,
            "DJANGO_SETTINGS_MODULE": SETTINGS[spec.side],
            "PGSTAGE_TASK_MODULES": "bench.tasks",
            # Both sides log warnings only. Each side's job lines (procrastinate's worker
            # records, through the project's LOGGING, which bench.plain_settings
            # inherits) are kept at JOB_LOG_LEVEL: off on both (on, at INFO, they cost
            # each worker about 0.1 ms of CPU a job or more).
            "LOG_LEVEL": "WARNING",
            "PROCRASTINATE_LOG_LEVEL": "WARNING",
            "JOB_LOG_LEVEL": "WARNING",
            "PGAPPNAME": f"{group.app_prefix}{index}",
            "PYTHONUNBUFFERED": "1",
        }
        with open(log, "w") as handle:
            group.processes.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "manage.py",
                        "procrastinate",
                        "worker",
                        f"--concurrency={spec.concurrency}",
                        f"--queues={','.join(spec.queues)}",
                        f"--name={group.app_prefix}{index}",
                    ],
                    cwd=ROOT,
                    env=env,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        group.logs.append(log)
    return group


def _wait_listening(groups: Sequence[WorkerGroup], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    ready: set[str] = set()
    wanted = {f"{g.app_prefix}{i}" for g in groups for i in range(len(g.processes))}
    while not wanted <= ready:
        for group in groups:
            group.check_alive()
            ready.update(
                row[0]
                for row in database.fetch_all(
                    "listening_workers", prefix=group.app_prefix + "%", listen="LISTEN%"
                )
            )
        if time.monotonic() > deadline:
            missing = ", ".join(sorted(wanted - ready))
            raise BenchError(f"worker(s) {missing} did not start within {timeout:.0f} s")
        time.sleep(0.2)


def _peak_rss_kib(pid: int) -> int | None:
    """The process's own resident-set high-water mark (``VmHWM``, Linux). Not wait4's
    ``ru_maxrss``: that one also holds the harness's resident set at the fork that
    started the worker, which is larger than a worker's."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def _stop(group: WorkerGroup, timeout: float = 60) -> None:
    for process in group.processes:
        if process.poll() is None:
            peak = _peak_rss_kib(process.pid)
            if peak is not None:
                group.peak_rss_kib.append(peak)
            process.send_signal(signal.SIGTERM)
    for process in group.processes:
        deadline = time.monotonic() + timeout
        while True:
            try:
                pid, status = os.waitpid(process.pid, os.WNOHANG)
            except ChildProcessError:
                break
            if pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                os.killpg(process.pid, signal.SIGKILL)
                deadline = time.monotonic() + timeout
            time.sleep(0.05)


@contextmanager
def running(
    specs: Sequence[GroupSpec], *, log_dir: Path, timeout: float = 180
) -> Iterator[list[WorkerGroup]]:
    """Start every group, wait until all listen, yield them; stop them (SIGTERM) after."""
    groups: list[WorkerGroup] = []
    try:
        for spec in specs:
            groups.append(_start(spec, log_dir))
        _wait_listening(groups, timeout)
        yield groups
    finally:
        for group in groups:
            _stop(group)


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid``, all its threads."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


def _local_backend(pid: int) -> bool:
    """Whether ``pid`` is a PostgreSQL backend on this machine (a server elsewhere has its
    own pids: they name nothing here, or a process that is not a backend)."""
    try:
        return psutil.Process(pid).name() == "postgres"
    except psutil.Error:
        return False


@dataclass(frozen=True)
class CpuReading:
    """CPU seconds so far of a group's worker processes and of its server sessions, each
    session by pid (None: the server is not on this machine)."""

    worker: float
    sessions: dict[int, float] | None

    def since(self, earlier: CpuReading) -> tuple[float, float | None]:
        """Worker and server CPU seconds between ``earlier`` and this reading; a session
        that connected in between counts from its start (one that closed in between is
        lost: the workers keep theirs)."""
        server = None
        if self.sessions is not None and earlier.sessions is not None:
            server = sum(cpu - earlier.sessions.get(pid, 0.0) for pid, cpu in self.sessions.items())
        return self.worker - earlier.worker, server


def cpu_reading(group: WorkerGroup) -> CpuReading:
    """The group's CPU so far: its worker processes (every thread) and its sessions on the
    server (named by the group's ``PGAPPNAME``), as the kernel counts them (psutil)."""
    worker = sum(_cpu_seconds(p.pid) or 0.0 for p in group.processes)
    pids = [row[0] for row in database.fetch_all("group_sessions", prefix=group.app_prefix + "%")]
    sessions: dict[int, float] | None = {}
    for pid in pids:
        cpu = _cpu_seconds(pid) if _local_backend(pid) else None
        if cpu is None:
            sessions = None
            break
        sessions[pid] = cpu
    return CpuReading(worker=worker, sessions=sessions)


def machine_cpu() -> tuple[float, float]:
    """CPU seconds so far of the whole machine, busy and in all, every CPU summed. Busy
    is everything but idle and I/O wait."""
    times = psutil.cpu_times()
    waiting = times.idle + getattr(times, "iowait", 0.0)
    busy = sum(times) - waiting - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return busy, busy + waiting


@dataclass(frozen=True)
class Span:
    jobs: int
    seconds: float
    #: CPU seconds of the group's worker processes and server sessions (``cpu_of``).
    worker_cpu: float | None = None
    server_cpu: float | None = None

    def per_job_ms(self) -> dict[str, float | None]:
        """Wall time, worker CPU and server CPU per job, in ms."""

        def ms(seconds: float | None) -> float | None:
            return None if seconds is None else round(seconds / self.jobs * 1000, 3)

        return {
            "wall": ms(self.seconds),
            "worker_cpu": ms(self.worker_cpu),
            "server_cpu": ms(self.server_cpu),
        }

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds if self.seconds > 0 else float("inf")


def wait_done(
    *,
    after: int,
    queues: Sequence[str],
    tasks: Sequence[str],
    expected: int,
    groups: Sequence[WorkerGroup],
    timeout: float = 600,
    poll: float = 0.1,
) -> Span:
    """Wait until ``expected`` jobs (of ``tasks`` on ``queues``, newer than ``after``)
    succeeded; return their span from the first start to the last end."""
    deadline = time.monotonic() + timeout
    while True:
        done, broken, first_start, last_end = database.fetch_one(
            "job_span", after=after, queues=list(queues), tasks=list(tasks)
        )
        if broken:
            raise BenchError(
                f"{broken} bench job(s) failed or were retried; worker logs:\n"
                + "\n".join(g.log_tail() for g in groups)
            )
        if done >= expected:
            return Span(jobs=done, seconds=(last_end - first_start).total_seconds())
        for group in groups:
            group.check_alive()
        if time.monotonic() > deadline:
            raise BenchError(f"only {done} of {expected} bench jobs ended within {timeout:.0f} s")
        time.sleep(poll)


def run_batch(
    enqueue: Callable[[], Any],
    *,
    queues: Sequence[str],
    tasks: Sequence[str],
    expected: int,
    groups: Sequence[WorkerGroup],
    cpu_of: WorkerGroup | None = None,
) -> Span:
    """Enqueue a batch in one transaction (visible at once, the table analysed with it:
    ``analyze_jobs``) and time it as it runs; its jobs are deleted, and the table
    vacuumed, afterwards. With ``cpu_of``, the span also carries the CPU that group's
    worker processes and server sessions spent on the batch (read just before the batch
    is enqueued and just after its last job ended)."""
    after = database.last_job_id()
    before = cpu_reading(cpu_of) if cpu_of is not None else None
    with transaction.atomic():
        enqueue()
        database.execute("analyze_jobs")
    span = wait_done(after=after, queues=queues, tasks=tasks, expected=expected, groups=groups)
    if cpu_of is not None and before is not None:
        worker, server = cpu_reading(cpu_of).since(before)
        span = replace(span, worker_cpu=worker, server_cpu=server)
    database.discard_batch(after)
    return span


def counted_batch(
    enqueue: Callable[[], Any],
    *,
    queue: str,
    tasks: Sequence[str],
    expected: int,
    groups: Sequence[WorkerGroup],
    counters: Sequence[Callable[[], Any]],
    settle: float = 0.3,
) -> list[Any]:
    """Run a batch between two readings of each counter, with nothing of the harness's in
    between that a counter could see: the batch is enqueued and parked first, then
    handed to ``queue`` and its workers woken. Returns each counter's difference."""
    after = database.last_job_id()
    with transaction.atomic():
        enqueue()
        database.execute("park_jobs", parked=PARKED_QUEUE, after=after, tasks=list(tasks))
        database.execute("analyze_jobs")
    before = [read() for read in counters]
    database.execute("release_jobs", queue=queue, parked=PARKED_QUEUE)
    database.execute("notify_queue", queue=queue, job_id=after + 1)
    wait_done(after=after, queues=[queue], tasks=tasks, expected=expected, groups=groups)
    # The last job's outcome is committed; give its reply time to pass the counters.
    time.sleep(settle)
    counted = [read() - start for read, start in zip(counters, before, strict=True)]
    database.discard_batch(after)
    return counted
