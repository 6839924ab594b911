"""A small process supervisor for ``manage.py run_all``: the web server and a worker side
by side.

A worker that exits with a non-zero status (a crash, or a worker that gave up waiting for
the database) is started again after a capped exponential delay (1 s, 2 s, 4 s … 30 s),
reset once a run has lasted a minute; a worker that exits 0 was stopped on purpose (a
drain) and stays stopped. The web server is not restarted: gunicorn already replaces its
own workers, so its master exiting is an error (a taken port, bad settings) that stops
everything.

Stopping (Ctrl-C, SIGTERM) sends SIGTERM to every child, so the worker drains its running
jobs, waits up to each child's ``stop_timeout``, then kills what is left. Children run in
their own session: a Ctrl-C in the terminal reaches only the supervisor, which then stops
them in order instead of them all being interrupted at once.

Production does not use this: systemd or the container runtime restarts processes
(docs/deploy.md). A Procfile runner (honcho) was weighed and not taken: it stops every
process when one exits and never restarts one, and it kills what is left five seconds
after its SIGTERM, which would cut a worker's drain short (docs/design.md#libraries).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from queueing.backoff import ceiling

#: Restart delays: ``min(cap, base·2^n)`` after the n-th quick exit in a row.
RESTART_BASE_SECONDS = 1.0
RESTART_CAP_SECONDS = 30.0
#: A run that lasted this long resets the delay to its base.
STABLE_AFTER_SECONDS = 60.0
POLL_SECONDS = 0.2


class Output(Protocol):
    """Where the supervisor reports: a text stream, or a command's ``self.stdout``."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


@dataclass(kw_only=True)
class Child:
    """One supervised command."""

    name: str
    argv: Sequence[str]
    restart_on_failure: bool
    stop_timeout: float
    process: subprocess.Popen | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    exits: list[int] = field(default_factory=list)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


def restart_delay(failures: int) -> float:
    """Seconds to wait before the restart that follows ``failures`` quick exits in a row."""
    return ceiling(max(failures - 1, 0), base=RESTART_BASE_SECONDS, cap=RESTART_CAP_SECONDS)


class Supervisor:
    """Runs ``children`` until one that is not restarted exits, or until :meth:`stop`."""

    def __init__(
        self,
        children: Sequence[Child],
        *,
        cwd: Path,
        env: dict[str, str] | None = None,
        out: Output,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.children = list(children)
        self.cwd = cwd
        self.env = env
        self.out = out
        self.clock = clock
        self.stopping = False

    def say(self, text: str) -> None:
        self.out.write(f"[run] {text}\n")
        self.out.flush()

    def start(self, child: Child) -> None:
        child.process = subprocess.Popen(
            list(child.argv), cwd=self.cwd, env=self.env, start_new_session=True
        )
        child.started_at = self.clock()
        child.restart_at = None
        self.say(f"{child.name} started (pid {child.process.pid})")

    def run(self) -> int:
        """Start every child and supervise them; returns the exit status for the caller."""
        for child in self.children:
            self.start(child)
        while not self.stopping:
            status = self.step()
            if status is not None:
                self.stop()
                return status
            time.sleep(POLL_SECONDS)
        return 0

    def step(self) -> int | None:
        """One look at every child: note exits, schedule and perform restarts. Returns an
        exit status when supervision must end."""
        now = self.clock()
        for child in self.children:
            if child.process is None:
                if child.restart_at is not None and now >= child.restart_at:
                    self.start(child)
                continue
            code = child.process.poll()
            if code is None:
                continue
            child.process = None
            child.exits.append(code)
            if not child.restart_on_failure:
                self.say(f"{child.name} exited with status {code}; stopping everything")
                return code or 1
            if code == 0:
                self.say(f"{child.name} stopped cleanly (status 0); not restarted")
                continue
            if now - child.started_at >= STABLE_AFTER_SECONDS:
                child.failures = 0
            child.failures += 1
            delay = restart_delay(child.failures)
            child.restart_at = now + delay
            self.say(f"{child.name} exited with status {code}; restarting in {delay:.0f} s")
        return None

    def stop(self) -> None:
        """SIGTERM every running child (a worker drains), wait, then SIGKILL stragglers.
        Idempotent."""
        self.stopping = True
        running = [(c, c.process) for c in self.children if c.process and c.running]
        for _, process in running:
            process.send_signal(signal.SIGTERM)
        for child, process in running:
            try:
                process.wait(timeout=child.stop_timeout)
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop within {child.stop_timeout:.0f} s; killed")
                process.kill()
                process.wait()
