"""``make run``'s supervisor (queueing.supervisor) and ``manage.py run_all``.

Fault model: the worker crashes (non-zero exit) → restarted after a capped, growing
delay (``test_a_crashing_worker_is_restarted_with_growing_delays``), reset by a long run
(``test_a_long_run_resets_the_delay``); the worker stops cleanly → left stopped
(``test_a_clean_exit_is_not_restarted``); the web server dies → everything stops
(``test_the_web_server_exiting_stops_supervision``); stop → SIGTERM, then SIGKILL past
the timeout (``test_stop_*``); and the real thing, gunicorn plus a SIGKILLed worker
(``test_run_all_serves_with_gunicorn_and_restarts_a_killed_worker``).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys

import pytest
from django.core.management import call_command

from queueing.supervisor import (
    RESTART_CAP_SECONDS,
    STABLE_AFTER_SECONDS,
    Child,
    Supervisor,
    restart_delay,
)
from tests.conftest import ROOT, database_url
from tests.servers import free_port, http, wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def python_child(name: str, code: str, *, restart: bool = True, stop_timeout: float = 10) -> Child:
    return Child(
        name=name,
        argv=[sys.executable, "-c", code],
        restart_on_failure=restart,
        stop_timeout=stop_timeout,
    )


def supervisor(*children: Child, clock: Clock | None = None) -> Supervisor:
    return Supervisor(children, cwd=ROOT, out=io.StringIO(), clock=clock or Clock())


def exited(child: Child) -> None:
    child.process.wait(timeout=30)


def test_restart_delays_grow_and_are_capped():
    delays = [restart_delay(n) for n in range(1, 9)]
    assert delays == [1, 2, 4, 8, 16, 30, 30, 30]
    assert max(delays) == RESTART_CAP_SECONDS


def test_a_crashing_worker_is_restarted_with_growing_delays():
    clock = Clock()
    worker = python_child("worker", "raise SystemExit(3)")
    sup = supervisor(worker, clock=clock)
    sup.start(worker)
    first_pid = worker.process.pid
    for expected_delay in (1, 2, 4):
        exited(worker)
        assert sup.step() is None
        assert worker.process is None
        assert worker.restart_at == clock.now + expected_delay
        clock.now += expected_delay - 0.5
        sup.step()
        assert worker.process is None, "restarted before its delay"
        clock.now += 0.5
        sup.step()
        assert worker.process is not None
    assert worker.process.pid != first_pid
    assert worker.exits == [3, 3, 3]
    assert "exited with status 3; restarting in 4 s" in sup.out.getvalue()
    exited(worker)


def test_a_long_run_resets_the_delay():
    clock = Clock()
    worker = python_child("worker", "raise SystemExit(1)")
    sup = supervisor(worker, clock=clock)
    worker.failures = 5
    sup.start(worker)
    exited(worker)
    clock.now += STABLE_AFTER_SECONDS
    sup.step()
    assert worker.failures == 1
    assert worker.restart_at == clock.now + 1


def test_a_clean_exit_is_not_restarted():
    clock = Clock()
    worker = python_child("worker", "pass")
    sup = supervisor(worker, clock=clock)
    sup.start(worker)
    exited(worker)
    assert sup.step() is None
    clock.now += 3600
    sup.step()
    assert worker.process is None and worker.restart_at is None
    assert "not restarted" in sup.out.getvalue()


def test_the_web_server_exiting_stops_supervision():
    web = python_child("web", "raise SystemExit(4)", restart=False)
    sup = supervisor(web)
    sup.start(web)
    exited(web)
    assert sup.step() == 4


def test_stop_sends_sigterm_so_the_worker_drains(tmp_path):
    drained = tmp_path / "drained"
    code = (
        "import signal, sys, time, pathlib\n"
        "def drain(*_):\n"
        f"    pathlib.Path({str(drained)!r}).write_text('ok'); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, drain)\n"
        f"pathlib.Path({str(tmp_path / 'ready')!r}).touch()\n"
        "time.sleep(60)\n"
    )
    worker = python_child("worker", code)
    sup = supervisor(worker)
    sup.start(worker)
    wait_until(lambda: (tmp_path / "ready").exists(), timeout=30, message="the child to start")
    sup.stop()
    assert worker.process.returncode == 0
    assert drained.read_text() == "ok"


def test_stop_kills_a_child_that_ignores_sigterm(tmp_path):
    code = (
        "import signal, time, pathlib\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(tmp_path / 'ready')!r}).touch()\n"
        "time.sleep(60)\n"
    )
    worker = python_child("worker", code, stop_timeout=0.5)
    sup = supervisor(worker)
    sup.start(worker)
    wait_until(lambda: (tmp_path / "ready").exists(), timeout=30, message="the child to start")
    sup.stop()
    assert worker.process.returncode == -signal.SIGKILL
    assert "killed" in sup.out.getvalue()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_all_serves_with_gunicorn_and_restarts_a_killed_worker(clean_queue, tmp_path):
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "STATIC_ROOT": str(tmp_path / "static"),
        "WORKER_STATE_DIR": str(tmp_path / "workers"),
        "WEB_WORKERS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    log_path = tmp_path / "run.log"
    with open(log_path, "w") as log:
        run = subprocess.Popen(
            [sys.executable, "manage.py", "run_all", "--port", str(port), "--concurrency", "1"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def worker_pids() -> list[int]:
        return [int(p) for p in re.findall(r"worker started \(pid (\d+)\)", log_path.read_text())]

    try:
        wait_until(
            lambda: http("GET", f"{url}/healthz").status == 200, timeout=60, message="the web"
        )
        reply = http("GET", f"{url}/healthz")
        assert reply.headers["Server"].startswith("gunicorn")
        css = http("GET", f"{url}/static/admin/css/base.css")
        assert css.status == 200 and b"body" in css.body
        wait_until(
            lambda: http("GET", f"{url}/readyz").status == 200,
            timeout=60,
            message=lambda: (
                f"a worker heartbeat (readyz): {http('GET', f'{url}/readyz').body!r}"
                f"\n{log_path.read_text()[-3000:]}"
            ),
        )

        os.kill(worker_pids()[0], signal.SIGKILL)
        wait_until(lambda: len(worker_pids()) == 2, timeout=30, message="the worker's restart")
        assert "worker exited with status -9; restarting in 1 s" in log_path.read_text()
        wait_until(
            lambda: "Starting worker" in log_path.read_text().split("restarting in")[-1],
            timeout=60,
            message="the restarted worker to run",
        )

        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=90) == 0
        output = log_path.read_text()
        assert "Stopped worker" in output
        assert "Shutting down: Master" in output
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(timeout=10)
        # Children run in their own sessions: a failed test must not leave them behind.
        for pid in re.findall(r"started \(pid (\d+)\)", log_path.read_text()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid), signal.SIGKILL)


def test_run_all_from_another_directory_gives_its_children_the_project(monkeypatch, tmp_path):
    """``python src/manage.py run_all`` from outside the project's directory: the web
    server and the worker it starts must import the project's settings and WSGI module
    as the command did (they are started in the current directory, where neither is)."""
    from queueing.management.commands import run_all

    started: dict = {}

    class Recording:
        def __init__(self, children, *, cwd, env, out):
            started.update(children=children, cwd=cwd, env=env)
            self.stopping = False

        def run(self) -> int:
            return 0

        def stop(self) -> None:
            pass

    monkeypatch.setattr(run_all, "Supervisor", Recording)
    monkeypatch.setattr(run_all, "call_command", lambda *args, **kwargs: None)
    monkeypatch.setattr(run_all.signal, "signal", lambda *args: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)

    call_command("run_all", "--port", "8123", stdout=io.StringIO())

    from django.conf import settings

    wsgi_module = settings.WSGI_APPLICATION.rpartition(".")[0]
    for module in (os.environ["DJANGO_SETTINGS_MODULE"], wsgi_module):
        done = subprocess.run(
            [sys.executable, "-c", f"import {module}"],
            cwd=started["cwd"],
            env=started["env"],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
