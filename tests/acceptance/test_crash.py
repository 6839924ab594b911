"""A crash of PostgreSQL and a claims-first task's fetch (``queueing.flush``), on a private
server the test crashes (an immediate shutdown: no checkpoint, crash recovery at the next
start).

A claims-first fetch commits with ``synchronous_commit`` off: its commit record may still
be in the server's WAL buffers when it answers. The WAL writer writes it out within
moments, so the window is short; the test holds the WAL writer (SIGSTOP) to crash the
server inside it, every time. What is lost is the fetch and nothing else: after the
restart the job is waiting again, as if never fetched — the state from which the fetched
run, should it go on, claims nothing (tests/queueing/test_ledger.py,
test_a_run_whose_job_was_taken_back_claims_nothing). Any other task's fetch commits after
its flush and survives the same crash.
"""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
from procrastinate.contrib.django import app

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.worker import fetch_by_task_name, queries
from tests.acceptance.private_pg import PrivateServer, private_server

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("private_pg")]


def _fetch_then_crash(pg: PrivateServer, task_name: str) -> tuple[int, str, str]:
    """Enqueue a job of ``task_name``, fetch it as a worker does with the WAL writer held,
    crash the server, start it: the job's id, its status just before the crash and
    after the restart."""
    with pg.connect() as conn:
        conn.execute("DELETE FROM procrastinate_jobs")
        (job_id,) = conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "VALUES ('default', %s, '{}') RETURNING id",
            [task_name],
        ).fetchone()
        (worker_id,) = conn.execute(
            "INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id"
        ).fetchone()
        conn.execute("CHECKPOINT")  # the job and the worker are on disk, whatever follows
        (walwriter,) = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'"
        ).fetchone()
    params = fetch_by_task_name(app).fetch_params(None, worker_id)
    os.kill(walwriter, signal.SIGSTOP)
    try:
        with pg.connect() as conn:
            row = conn.execute(queries["fetch_job"], params).fetchone()
            assert row[0] == job_id
            (before,) = conn.execute(
                "SELECT status FROM procrastinate_jobs WHERE id = %s", [job_id]
            ).fetchone()
        pg.crash()
    finally:
        with contextlib.suppress(ProcessLookupError):  # the crash ended it
            os.kill(walwriter, signal.SIGCONT)
    pg.start()
    with pg.connect() as conn:
        (after,) = conn.execute(
            "SELECT status FROM procrastinate_jobs WHERE id = %s", [job_id]
        ).fetchone()
    return job_id, before, after


def test_a_crash_loses_a_claims_first_fetch_and_no_other():
    with private_server() as pg:
        pg.migrate()
        _, before, after = _fetch_then_crash(pg, "tests.stage")  # claims_first=True
        assert (before, after) == ("doing", "todo")
        _, before, after = _fetch_then_crash(pg, "tests.record")
        assert (before, after) == ("doing", "doing")
