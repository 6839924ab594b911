"""docs/getting-started.md, followed literally: a wheel built from this repository,
installed into a fresh virtualenv, a project made by ``django-admin startproject``, the
page's own code blocks, a real worker.

The page marks what this test takes from it by the fence's info string:

* ``sh run`` — commands run in the project directory, one line at a time;
* ``python file=PATH`` — the file's content (``append``: appended to it);
* ``sh worker`` — the worker command, started in the background;
* ``python shell`` — fed to ``python manage.py shell``.

Blocks without a mark (the ``pip install`` line) are for the reader: the test installs
the wheel it built instead of the published one. The pipeline must complete once (one
``sends``, one ``success`` row per stage) and the give-up hook must run once.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

PAGE = ROOT / "docs" / "getting-started.md"
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
#: Wheels of the dependencies, kept between runs so a rerun installs without the network.
WHEELHOUSE = ROOT / ".data" / "wheelhouse"
PIP = (sys.executable, "-m", "pip")
LOCAL = ("--find-links", str(WHEELHOUSE))


#: Section 7's endpoints, asked through Django's test client in the new project.
PROBE = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from django.test.utils import setup_test_environment
from queueing.metrics import snapshot_take

setup_test_environment()
snapshot_take()  # what the metrics_snapshot sweep does once a minute
client = Client()
answers = {
    "healthz": client.head("/healthz").status_code,
    "readyz": client.get("/readyz").status_code,
}
client.force_login(get_user_model().objects.create_superuser("root", "", "pw"))
answers["jobs"] = client.get("/admin/procrastinate/procrastinatejob/").status_code
answers["sweeps"] = client.get("/admin/procrastinate/procrastinatejob/sweeps/").status_code
metrics = client.get("/metrics")
answers["metrics"] = metrics.status_code
text = metrics.content.decode()
ledger = 'pgstage_ledger_entries{ledger="letters.letterstage",status="%s"} %s'
answers["ledger_success"] = ledger % ("success", "2.0") in text
answers["ledger_failed"] = ledger % ("failed", "1.0") in text
answers["workers_alive"] = 'pgstage_workers{state="alive"} 1.0' in text
print(json.dumps(answers))
"""


@dataclass(frozen=True)
class Block:
    language: str
    marks: tuple[str, ...]
    body: str

    def mark(self, prefix: str) -> str | None:
        return next((m.split("=", 1)[1] for m in self.marks if m.startswith(prefix)), None)


def blocks(text: str) -> list[Block]:
    found = []
    for match in FENCE.finditer(text):
        language, *marks = match["info"].split()
        found.append(Block(language=language, marks=tuple(marks), body=match["body"]))
    return found


def test_the_page_marks_every_step():
    marked = [b for b in blocks(PAGE.read_text()) if b.marks]
    kinds = [b.marks[0].split("=")[0] for b in marked]
    assert kinds.count("worker") == 1
    assert kinds.count("shell") == 1
    files = [b.mark("file=") for b in marked if b.mark("file=")]
    assert {"mysite/settings.py", "letters/models.py", "letters/tasks.py"} <= set(files)


def run(argv: list[str], *, cwd: Path, env: dict[str, str], stdin: str | None = None) -> str:
    done = subprocess.run(
        argv, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_venv(tmp_path: Path) -> Path:
    """The wheel of this checkout in a fresh virtualenv (dependencies from the wheelhouse,
    filled from pip's configured indexes the first time)."""
    dist = tmp_path / "dist"
    # The sdist, then the wheel from it in a temporary directory (nothing is built in
    # the checkout, and the sdist is shown to hold what the wheel needs).
    run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(ROOT)],
        cwd=ROOT,
        env=dict(os.environ),
    )
    (wheel,) = dist.glob("pgstage-*.whl")
    WHEELHOUSE.mkdir(parents=True, exist_ok=True)
    run(
        [*PIP, "wheel", "-q", "-w", str(WHEELHOUSE), *LOCAL, str(wheel)],
        cwd=ROOT,
        env=dict(os.environ),
    )
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env={})
    run(
        [
            *PIP,
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(WHEELHOUSE),
            str(wheel),
        ],
        cwd=tmp_path,
        env=dict(os.environ),
    )
    return venv


@pytest.fixture
def fresh_database():
    """A new, empty database on the test server; dropped afterwards."""
    connection.ensure_connection()
    info = connection.connection.info
    name = f"getting_started_{uuid.uuid4().hex[:10]}"
    params = {
        "host": info.host,
        "port": info.port,
        "user": info.user,
        "password": connection.settings_dict.get("PASSWORD") or "",
    }
    with psycopg.connect(dbname=info.dbname, autocommit=True, **params) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {**params, "dbname": name}
    finally:
        with psycopg.connect(dbname=info.dbname, autocommit=True, **params) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_page_runs_from_the_built_wheel_in_a_fresh_project(tmp_path, fresh_database):
    venv = build_venv(tmp_path)
    # Only the framework is installed: the reference site's packages are not.
    site_packages = next((venv / "lib").glob("python3*/site-packages"))
    installed = {p.name for p in site_packages.iterdir()}
    assert "queueing" in installed
    assert not {"config", "accounts", "pipeline", "runs"} & installed

    project = tmp_path / "project"
    project.mkdir()
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PGHOST": str(fresh_database["host"]),
        "PGPORT": str(fresh_database["port"]),
        "PGUSER": fresh_database["user"],
        "PGPASSWORD": fresh_database["password"],
        "PGDATABASE": fresh_database["dbname"],
        "PYTHONUNBUFFERED": "1",
        # Not this host's workers: keep their state out of the default directory.
        "TMPDIR": str(tmp_path),
    }
    worker = None
    worker_log = tmp_path / "worker.log"
    try:
        for block in blocks(PAGE.read_text()):
            if block.marks[:1] == ("run",):
                for line in block.body.splitlines():
                    if line.strip():
                        run(["/bin/sh", "-c", line], cwd=project, env=env)
            elif block.mark("file="):
                path = project / block.mark("file=")
                if "append" in block.marks:
                    with path.open("a") as handle:
                        handle.write("\n" + block.body)
                else:
                    path.write_text(block.body)
            elif block.marks[:1] == ("worker",):
                (command,) = [line for line in block.body.splitlines() if line.strip()]
                handle = worker_log.open("w")
                worker = subprocess.Popen(
                    ["/bin/sh", "-c", f"exec {command}"],
                    cwd=project,
                    env=env,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                )
            elif block.marks[:1] == ("shell",):
                run(["python", "manage.py", "shell"], cwd=project, env=env, stdin=block.body)
        assert worker is not None, "the page starts no worker"

        with psycopg.connect(autocommit=True, **fresh_database) as db:

            def letters() -> list[tuple]:
                return db.execute(
                    "SELECT text, status, sends FROM letters_letter ORDER BY id"
                ).fetchall()

            deadline = time.monotonic() + 60
            while [row[1] for row in letters()] != ["sent", "failed"]:
                assert worker.poll() is None, worker_log.read_text()
                assert time.monotonic() < deadline, (letters(), worker_log.read_text())
                time.sleep(0.2)
            (sent, failed) = letters()
            assert sent[2] == 1 and failed[2] == 0
            stages = db.execute(
                "SELECT l.status, s.stage, s.status, s.attempts FROM letters_letterstage s"
                " JOIN letters_letter l ON l.id = s.letter_id ORDER BY l.id, s.id"
            ).fetchall()
            assert stages == [
                ("sent", "draft", "success", 1),
                ("sent", "send", "success", 1),
                ("failed", "draft", "failed", 1),
            ]
            # The sweep finds nothing to resume, and running it changes nothing.
            out = run(["python", "manage.py", "sweep", "letters_resume"], cwd=project, env=env)
            assert "letters_resume" in out
            assert letters() == [sent, failed]
        # The admin, health and metrics of section 7, while the worker runs.
        out = run(["python", "manage.py", "shell"], cwd=project, env=env, stdin=PROBE)
        answers = json.loads(out.strip().splitlines()[-1])
        assert answers == {
            "healthz": 200,
            "readyz": 200,
            "jobs": 200,
            "sweeps": 200,
            "metrics": 200,
            "ledger_success": True,
            "ledger_failed": True,
            "workers_alive": True,
        }, answers
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=60) == 0, worker_log.read_text()
        log = worker_log.read_text()
        assert len(re.findall(r"letter \d+ given up", log)) == 1, log
        assert "job succeeded" in log
    finally:
        if worker is not None and worker.poll() is None:
            worker.kill()
            worker.wait()
