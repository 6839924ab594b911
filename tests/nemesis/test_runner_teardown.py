"""The runner, stopped from outside, tears its cluster down: its workers, its proxies and
its private PostgreSQL — also in the middle of an outage, when the fault's thread would
start the server again behind the teardown."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.nemesis, pytest.mark.timeout(120)]


def _history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            lines.append(json.loads(raw))
    return lines


def _survivors(data_dir: str, worker_pids: set[int]) -> list[str]:
    """The processes of the run still alive: a postgres of its data directory, a worker."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["pid"] in worker_pids or (data_dir in cmdline and "postgres" in cmdline):
            with_status = f"{process.info['pid']}: {cmdline[:160]}"
            try:
                if process.status() != psutil.STATUS_ZOMBIE:
                    found.append(with_status)
            except psutil.NoSuchProcess:
                pass
    return found


def test_a_runner_stopped_during_an_outage_leaves_no_server_and_no_worker(tmp_path):
    """SIGTERM (SIGINT, ^C, goes through the same handler and teardown)."""
    history_path = tmp_path / "run" / "history.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.nemesis.runner",
            "--seed=1",
            "--seconds=60",
            "--kinds=operator",
            # 8 s in (jobs run by then), the database refuses connections for 25 s.
            "--outage=8,25",
            f"--out={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started, workers = {}, set()
    try:
        deadline = time.monotonic() + 60
        while not any(
            line["type"] == "database" and line["event"] == "down"
            for line in _history(history_path)
        ):
            assert process.poll() is None, process.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no outage began"
            time.sleep(0.2)
        history = _history(history_path)
        [started] = [x for x in history if x["type"] == "database" and x["event"] == "started"]
        workers = {x["pid"] for x in history if x["type"] == "worker" and x["event"] == "start"}
        time.sleep(1)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pytest.fail("the runner took more than 20 s to tear its cluster down")
        # What the outage's thread would have done: start the server again, later.
        time.sleep(2)
        assert _survivors(started["data_dir"], workers) == []
        assert not Path(started["data_dir"]).exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _kill_survivors(started.get("data_dir", "-"), workers)


def _kill_survivors(data_dir: str, worker_pids: set[int]) -> None:
    """A failed teardown's leftovers (this test's processes) must not outlive it."""
    for process in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        if process.info["pid"] in worker_pids or (data_dir in cmdline and "postgres" in cmdline):
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()


def test_a_runner_killed_leaves_no_server_and_no_worker(tmp_path):
    """SIGKILL runs no teardown: the run's reaper stops its workers and its server."""
    history_path = tmp_path / "run" / "history.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.nemesis.runner",
            "--seed=1",
            "--seconds=60",
            "--kinds=operator",
            f"--out={tmp_path / 'run'}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    started, workers = {}, set()
    try:
        deadline = time.monotonic() + 90
        while not any(line["type"] == "fault" for line in _history(history_path)):
            assert process.poll() is None, process.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "no fault began"
            time.sleep(0.2)
        history = _history(history_path)
        [started] = [x for x in history if x["type"] == "database" and x["event"] == "started"]
        workers = {x["pid"] for x in history if x["type"] == "worker" and x["event"] == "start"}
        assert workers
        process.kill()
        process.wait()
        deadline = time.monotonic() + 30
        while (
            _survivors(started["data_dir"], workers) or Path(started["data_dir"]).exists()
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _survivors(started["data_dir"], workers) == []
        assert not Path(started["data_dir"]).exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        _kill_survivors(started.get("data_dir", "-"), workers)
