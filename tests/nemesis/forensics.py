"""What a run that did not end quiet leaves to read: a failing run in CI is read from its
output alone (the history and the workers' logs are gone with the machine's /tmp).

- Each worker (:mod:`tests.nemesis.tasks` is imported by both releases) dumps the stack of
  every thread on SIGUSR1 (``faulthandler``) and of every asyncio task on SIGUSR2, into
  its log.
- Once the run waited its bound for quiet in vain, the runner records what the database
  says of each job still waiting or running (its row, its worker's last heartbeat, its
  events: :func:`record_unfinished`) and asks every live worker for its stacks.
- :func:`report` then prints, for each such job, that record and every line of the
  workers' logs that names it, and the stacks of the worker that holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

THREADS_SIGNAL = signal.SIGUSR1
TASKS_SIGNAL = signal.SIGUSR2
#: The line each dump begins with (the tasks' dump; faulthandler's begins "Thread 0x…").
TASKS_MARK = "=== asyncio tasks of pid"

JOBS = """
    SELECT j.id, j.task_name, j.status::text, j.attempts, j.worker_id, j.queueing_lock,
           j.scheduled_at::text,
           round(extract(epoch FROM now() - w.last_heartbeat)::numeric, 1)
      FROM procrastinate_jobs j
      LEFT JOIN procrastinate_workers w ON w.id = j.worker_id
     WHERE j.status IN ('todo', 'doing') AND j.task_name NOT LIKE 'queueing.sweep%%'
     ORDER BY j.id LIMIT 10"""
EVENTS = """
    SELECT type::text, at::text FROM procrastinate_events WHERE job_id = %(id)s ORDER BY id"""
WORKERS = """
    SELECT id, round(extract(epoch FROM now() - last_heartbeat)::numeric, 1)
      FROM procrastinate_workers ORDER BY id"""


def install_dumps() -> None:
    """In a worker: the stacks on demand (idempotent; a no-op off the main thread)."""
    with contextlib.suppress(ValueError, RuntimeError):
        faulthandler.register(THREADS_SIGNAL, all_threads=True, chain=False)
        signal.signal(TASKS_SIGNAL, _dump_tasks)


def _dump_tasks(signum: int, frame: object) -> None:
    loop = asyncio._get_running_loop()  # the handler runs on the loop's (main) thread
    print(f"{TASKS_MARK} {os.getpid()} ===", file=sys.stderr, flush=True)
    if loop is None:
        print("(no running loop)", file=sys.stderr, flush=True)
        return
    for each in asyncio.all_tasks(loop):
        print(f"--- {each.get_name()}", file=sys.stderr)
        each.print_stack(limit=12, file=sys.stderr)
    sys.stderr.flush()


def record_unfinished(history: Any, pids: list[int]) -> None:
    """The database's view of every job still waiting or running, then the live workers'
    stacks (each into its log)."""
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute(JOBS)
            jobs = [list(map(_plain, row)) for row in cursor.fetchall()]
            for job in jobs:
                cursor.execute(EVENTS, {"id": job[0]})
                job.append([list(map(_plain, row)) for row in cursor.fetchall()])
            cursor.execute(WORKERS)
            workers = [list(map(_plain, row)) for row in cursor.fetchall()]
    except Exception as exc:  # the record must not end the run
        history.record("unfinished_detail", error=repr(exc))
        connection.close()
    else:
        history.record("unfinished_detail", jobs=jobs, workers=workers)
    # One dump at a time: faulthandler's (from the signal handler, on whichever thread
    # took the signal) walks every thread's frames while the tasks' dump (Python, on the
    # main thread) runs; both at once can crash the worker (SIGSEGV).
    for signum in (THREADS_SIGNAL, TASKS_SIGNAL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        time.sleep(1)  # the dumps' time to reach the logs


def _plain(value: Any) -> Any:
    return value if isinstance(value, int | float | str | type(None)) else str(value)


def report(history: list[dict], *, limit: int = 12_000) -> str:
    """The jobs the run left unfinished, what the logs say of each, and the stacks of the
    worker that started each last; empty when the run ended quiet."""
    detail = next((line for line in history if line["type"] == "unfinished_detail"), None)
    if detail is None:
        return ""
    out = ["", "== forensics: the jobs left waiting or running =="]
    if "error" in detail:
        out.append(f"(the database could not be read: {detail['error']})")
    logs = [Path(line["log"]) for line in history if line.get("event") == "start" and "log" in line]
    out.append("workers (id, seconds since the last beat): " + json.dumps(detail.get("workers")))
    for job in detail.get("jobs", []):
        job_id, task, status, attempts, worker_id, lock, scheduled, beat, events = job
        out.append(
            f"job {job_id} {task} {status} attempts={attempts} lock={lock} worker={worker_id} "
            f"(last beat {beat} s ago) scheduled={scheduled}"
        )
        out.append("  events: " + ", ".join(f"{kind}@{at[11:23]}" for kind, at in events))
        named = re.compile(rf"(\bid={job_id}\b|\bjob {job_id}\b|\[{job_id}\])")
        started = re.compile(rf"job started id={job_id}\b")
        holder = None
        for log in logs:
            for line in _lines(log):
                if named.search(line):
                    out.append(f"  {log.name}: {line[:400]}")
                if started.search(line):
                    holder = log
        if holder is not None:
            out.append(f"  stacks of {holder.name} (the last to start it):")
            out.extend("    " + line for line in _stacks(_lines(holder)))
    return "\n".join(out)[-limit:]


def _stacks(lines: list[str]) -> list[str]:
    """The last dumps in a log, without the frames of the standard library's and the
    dependencies' plumbing (kept: each thread's and task's header, and the project's own
    frames and their callers' names)."""
    first = next(
        (i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("Thread 0x")), None
    )
    if first is None:
        return ["(no stacks: the worker had exited)"]
    while first > 0 and lines[first - 1].startswith(("Thread 0x", "Current thread", "  File")):
        first -= 1
    kept, skipping = [], False
    for line in lines[first:]:
        if line.startswith("  File"):
            skipping = "/lib/python3" in line and (
                "site-packages" not in line or "procrastinate" not in line
            )
        elif not line.startswith("    "):  # a header: a thread's, a task's
            skipping = line.startswith("Stack for <Task")  # the name's line said it
        if not skipping:
            kept.append(line[:300])
    return kept[:150]


def _lines(log: Path) -> list[str]:
    try:
        return log.read_text(errors="replace").splitlines()
    except OSError:
        return []
