"""Shared fixtures: real PostgreSQL, real worker subprocesses, time travel by back-dating.

Tests that start workers or use concurrent connections need committed data: mark them
``@pytest.mark.django_db(transaction=True)`` and use ``clean_queue`` (procrastinate's
tables are not managed by Django, so the flush after a transactional test misses them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent
PROCRASTINATE_TABLES = (
    "procrastinate_events",
    "procrastinate_periodic_defers",
    "procrastinate_jobs",
    "procrastinate_workers",
    "pgstage_inline_sweeps",
    "pgstage_owed_give_ups",
)


def database_url() -> str:
    """A URL for the database this test session uses (the test database), read from the
    live connection so it is right for a TCP server and the embedded (socket) one alike."""
    connection.ensure_connection()
    info = connection.connection.info
    password = connection.settings_dict.get("PASSWORD") or ""
    auth = quote(info.user) + (f":{quote(password)}" if password else "")
    if info.host.startswith("/"):
        return f"postgresql://{auth}@/{info.dbname}?host={quote(info.host)}&port={info.port}"
    return f"postgresql://{auth}@{info.host}:{info.port}/{info.dbname}"


#: Rows a kept test database keeps: what the migrations wrote and stays the same.
KEPT_TABLES = ("django_migrations", "django_content_type", "auth_permission")


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker, request) -> None:
    """A test database kept from an earlier run (``--reuse-db``, the default) starts
    empty: a run that was killed mid-test (a transactional or browser test commits) would
    leave rows that a later run's tests trip over. One TRUNCATE, not a new database."""
    if request.config.getoption("create_db") or not request.config.getoption("reuse_db"):
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT quote_ident(tablename) FROM pg_tables "
            "WHERE schemaname = current_schema() AND NOT tablename = ANY(%s)",
            [list(KEPT_TABLES)],
        )
        tables = [row[0] for row in cursor.fetchall()]
        if tables:
            cursor.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY")


@pytest.fixture(autouse=True)
def _static_files_from_the_apps(settings, tmp_path_factory) -> None:
    """Pages name their static files as the app directories have them, whether or not
    someone ran ``collectstatic`` into ``.data/static`` (``make run`` does): its manifest
    would name content-hashed files that the test server (serving from the apps) lacks."""
    settings.STATIC_ROOT = tmp_path_factory.getbasetemp() / "no-collected-static"


@pytest.fixture
def clean_queue(transactional_db) -> Iterator[None]:
    """Empty procrastinate's tables before and after the test."""

    def truncate() -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"TRUNCATE {', '.join(PROCRASTINATE_TABLES)} RESTART IDENTITY CASCADE")

    truncate()
    yield
    truncate()


@dataclass
class WorkerProcess:
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def wait(self, timeout: float = 60) -> int:
        return self.process.wait(timeout=timeout)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


@pytest.fixture
def worker_env(tmp_path) -> dict[str, str]:
    env = dict(os.environ)
    env["DATABASE_URL"] = database_url()
    # The test's workers are not this host's (manage.py worker_health would list them).
    env["WORKER_STATE_DIR"] = str(tmp_path / "worker-state")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("LOG_LEVEL", "INFO")
    env["PROCRASTINATE_LOG_LEVEL"] = "INFO"
    return env


@pytest.fixture
def start_worker(worker_env, tmp_path) -> Iterator[Callable[..., WorkerProcess]]:
    """Start ``manage.py procrastinate worker`` subprocesses; each is stopped with SIGTERM
    (then SIGKILL) at teardown."""
    started: list[WorkerProcess] = []

    def start(
        *extra: str,
        env: dict[str, str] | None = None,
        name: str | None = None,
        concurrency: int = 1,
        wait_ready: bool = True,
    ) -> WorkerProcess:
        index = len(started)
        log_path = tmp_path / f"worker-{index}.log"
        args = [
            sys.executable,
            "manage.py",
            "procrastinate",
            "worker",
            f"--concurrency={concurrency}",
            f"--name={name or f'test-worker-{index}'}",
            *extra,
        ]
        handle = open(log_path, "w")  # noqa: SIM115 - closed with the process
        process = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**worker_env, **(env or {})},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        worker = WorkerProcess(process=process, log_path=log_path)
        started.append(worker)
        if wait_ready:
            wait_for(
                lambda: "Starting worker" in worker.log() or not worker.alive,
                timeout=30,
                message="worker start",
            )
            assert worker.alive, worker.log()
        return worker

    yield start
    for worker in started:
        if worker.alive:
            worker.signal(signal.SIGTERM)
    for worker in started:
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.wait(timeout=10)


def wait_for(
    predicate: Callable[[], bool],
    *,
    timeout: float = 30,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition",
) -> None:
    """Poll ``predicate`` until it holds (waiting on real processes, not moving time).
    ``message`` may be a callable: it is called at the timeout, so that what it shows (a
    worker's log) is what was there when the wait gave up."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    text = message() if callable(message) else message
    raise AssertionError(f"timed out after {timeout}s waiting for {text}")


def run_concurrently(func: Callable[[int], object], count: int) -> list[object]:
    """Run ``func(i)`` in ``count`` threads released together; each thread has its own
    Django connection. Returns results (or raised exceptions) in index order."""
    from django.db import connections

    barrier = threading.Barrier(count)
    results: list[object] = [None] * count

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = func(i)
        except BaseException as exc:
            results[i] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def jobs(**filters) -> list[dict]:
    """Rows of procrastinate_jobs (as dicts), filtered by equality on columns."""
    where = " AND ".join(f"{k} = %({k})s" for k in filters) or "TRUE"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, task_name, status, queueing_lock, args, attempts, worker_id "
            f"FROM procrastinate_jobs WHERE {where} ORDER BY id",
            filters,
        )
        cols = [c[0] for c in cursor.description]
        rows = [dict(zip(cols, row, strict=True)) for row in cursor.fetchall()]
    for row in rows:
        # Django's psycopg backend hands jsonb back as text.
        if isinstance(row["args"], str):
            row["args"] = json.loads(row["args"])
    return rows


def beaten_worker(heartbeat_age_s: float) -> int:
    """A procrastinate worker row whose last beat is ``heartbeat_age_s`` seconds old."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - %s * interval '1 second') RETURNING id",
            [heartbeat_age_s],
        )
        return cursor.fetchone()[0]


def make_doing(job_id: int, *, attempts: int = 0, heartbeat_age_s: float = 120) -> int:
    """A job claimed by a worker whose heartbeat is ``heartbeat_age_s`` old, while stalled
    recovery was running all along (its clock: a run just now, no gap for an hour); a test
    of a gap moves the clock after this (:func:`recovery_ran`)."""
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    worker_id = beaten_worker(heartbeat_age_s)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s, attempts = %s "
            "WHERE id = %s",
            [worker_id, attempts, job_id],
        )
    return worker_id


def registered_worker(
    *, task_names: list[str], hooks: list[str] | None = None, heartbeat_age_s: float = 0
) -> int:
    """A worker registered with its task names (and give-up hooks), last beaten
    ``heartbeat_age_s`` seconds ago, as ``register_worker`` records it."""
    worker_id = beaten_worker(heartbeat_age_s)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgstage_worker_tasks (worker_id, task_names, hooks) VALUES (%s, %s, %s)",
            [worker_id, task_names, hooks],
        )
    return worker_id


def recovery_ran(*, last_run_ago: float, resumed_ago: float) -> None:
    """Stalled recovery's clock (``pgstage_inline_sweeps``): it last ran ``last_run_ago``
    seconds ago and last resumed after a gap ``resumed_ago`` seconds ago."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO pgstage_inline_sweeps (name, last_run, resumed_at) "
            "VALUES ('stalled_jobs', now() - %s * interval '1 s', now() - %s * interval '1 s') "
            "ON CONFLICT (name) DO UPDATE SET last_run = EXCLUDED.last_run, "
            "resumed_at = EXCLUDED.resumed_at",
            [last_run_ago, resumed_ago],
        )
