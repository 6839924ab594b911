"""The runner's reaper: what a run started does not outlive the runner, even a runner
killed with SIGKILL, which runs no teardown.

The runner starts it in a session of its own, holding the write end of its stdin. When
that closes — the runner tore its cluster down and wrote ``done``, or died without a word
— the reaper reads the run's history: each worker the run started that still lives (its
``NEMESIS_EFFECTS_DIR`` is in the run's directory: a reused pid is someone else's) is
killed with its process group, and the run's private PostgreSQL (``postmaster.pid`` of
the data directory the history names) gets an immediate shutdown, then its directory
goes. Workers would otherwise retry their closed proxies for their whole outage window,
and the server would run until the machine stops.

``python -m tests.nemesis.reaper HISTORY``"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import psutil


def _history(path: Path) -> list[dict]:
    lines = []
    with contextlib.suppress(OSError):
        for raw in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # the line being written
                lines.append(json.loads(raw))
    return lines


def _kill_workers(history: list[dict], run_dir: Path) -> None:
    pids = {x["pid"] for x in history if x.get("type") == "worker" and x.get("event") == "start"}
    for pid in pids:
        try:
            effects = psutil.Process(pid).environ().get("NEMESIS_EFFECTS_DIR", "")
        except (psutil.Error, OSError):
            continue
        if effects and Path(effects).resolve().is_relative_to(run_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _stop_server(history: list[dict]) -> None:
    started = [x for x in history if x.get("type") == "database" and x.get("event") == "started"]
    if not started:
        return
    data_dir = Path(started[0]["data_dir"])
    try:
        pid = int((data_dir / "postmaster.pid").read_text().splitlines()[0])
        postmaster = psutil.Process(pid)
        if str(data_dir) not in " ".join(postmaster.cmdline()):
            raise psutil.NoSuchProcess(pid)
    except (OSError, ValueError, IndexError, psutil.Error):
        postmaster = None
    if postmaster is not None:
        with contextlib.suppress(psutil.Error):
            postmaster.send_signal(signal.SIGQUIT)  # an immediate shutdown
            _, alive = psutil.wait_procs([postmaster], timeout=10)
            for process in alive:
                process.kill()
    shutil.rmtree(data_dir.parent, ignore_errors=True)


def reap(history_path: Path) -> None:
    history = _history(history_path)
    _kill_workers(history, history_path.parent.resolve())
    _stop_server(history)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a ^C is the runner's to handle
    history_path = Path(argv[0])
    said = sys.stdin.read()  # until the runner closes it, or dies
    if said.strip() != "done":
        reap(history_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
