"""Which procrastinate workers run on this host: the link ``manage.py worker_health``
needs between a local process and its row in ``procrastinate_workers``.

procrastinate keeps only an id and a heartbeat per worker, nothing that names a host or
a process. A worker does log its id when it starts (the ``start_worker`` record), so a
logging handler on ``procrastinate.worker`` writes ``<pid>.json`` (pid, the process's
start time, worker id) into ``WORKER_STATE_DIR`` then, and removes it when the worker
stops. A project wires it in ``LOGGING`` as a handler of the ``procrastinate.worker``
logger (at INFO or below: the start record is an INFO line); no change to the worker
itself. ``WORKER_STATE_DIR`` defaults to ``pgstage-workers-<uid>`` in the system's
temporary directory.

A file outlives a killed worker; readers skip files whose process is gone or whose pid
now belongs to another process (its start time differs).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

__all__ = ["WorkerStateHandler"]

START_ACTION = "start_worker"
STOP_ACTION = "stop_worker"


@dataclass(frozen=True, kw_only=True)
class RecordedWorker:
    pid: int
    started: str
    worker_id: int
    name: str


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' where /proc is missing):
    with the pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name (field 2) may hold spaces; the fields after it are plain.
    return stat.rsplit(")", 1)[1].split()[19]


def state_dir() -> Path:
    configured = getattr(settings, "WORKER_STATE_DIR", None)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"pgstage-workers-{os.getuid()}"


class WorkerStateHandler(logging.Handler):
    """Records this worker process's id on ``start_worker`` and forgets it on
    ``stop_worker``; every other record is ignored."""

    #: It ignores job records: the worker need not build them for it
    #: (:func:`queueing.logs.takes_job_records`).
    job_records = False

    def __init__(self, directory: str | None = None):
        super().__init__()
        self.directory = Path(directory) if directory else None

    def emit(self, record: logging.LogRecord) -> None:
        action = getattr(record, "action", None)
        if action not in (START_ACTION, STOP_ACTION):
            return
        try:
            directory = self.directory or state_dir()
            path = directory / f"{os.getpid()}.json"
            if action == STOP_ACTION:
                path.unlink(missing_ok=True)
                return
            worker = getattr(record, "worker", None) or {}
            if worker.get("worker_id") is None:
                return
            directory.mkdir(parents=True, exist_ok=True)
            _forget_dead(directory)
            state = {
                "pid": os.getpid(),
                "started": process_start(os.getpid()),
                "worker_id": int(worker["worker_id"]),
                "name": str(worker.get("name") or ""),
            }
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(path)
        except Exception:
            self.handleError(record)


def _forget_dead(directory: Path) -> None:
    live = {w.pid for w in recorded_workers(directory)}
    for path in directory.glob("*.json"):
        if path.stem.isdigit() and int(path.stem) not in live:
            path.unlink(missing_ok=True)


def recorded_workers(directory: Path | None = None) -> Iterator[RecordedWorker]:
    """Workers recorded on this host whose process is still the one that recorded them."""
    directory = directory or state_dir()
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.json")):
        try:
            state = json.loads(path.read_text())
            worker = RecordedWorker(
                pid=int(state["pid"]),
                started=str(state.get("started", "")),
                worker_id=int(state["worker_id"]),
                name=str(state.get("name", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if worker.started and process_start(worker.pid) != worker.started:
            continue
        yield worker
