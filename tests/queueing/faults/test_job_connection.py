"""A job thread's Django connection killed while idle between jobs.

Fixed: the job thread drops a connection whose socket turned readable while idle (the
server's goodbye), with no round trip. Before that:

PgstageWorker turns Django's ``CONN_HEALTH_CHECKS`` off for every job thread and renews a
thread's connection only after one of the worker's own loops saw a database error
(``_fresh_connection``, queueing/worker.py): "a connection only goes bad when the database
went away, which this worker's own loops notice". But one backend can end alone — a DBA's
``pg_terminate_backend``, ``idle_session_timeout``, a proxy dropping idle sockets — and the
worker's loops, on psycopg_pool's checked connections, notice nothing. The next job on that
thread then fails on its first query: an attempt spent (a ``retry=False`` task, every
sweep, fails for good) for no fault of the job —
test_a_job_after_its_threads_idle_connection_was_killed_runs_first_time.
"""

from __future__ import annotations

import pytest
from django.db import connection

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import enqueue
from tests.conftest import jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_a_job_after_its_threads_idle_connection_was_killed_runs_first_time(effects, task_worker):
    worker = task_worker("--queues=default")
    enqueue("tests.record", args={"label": "first"})
    wait_for(lambda: "first" in effects(), message=f"the first job\n{worker.log()}")
    wait_for(lambda: jobs(task_name="tests.record")[0]["status"] == "succeeded", message="end")

    # The job thread's connection, idle since its INSERT (CONN_MAX_AGE keeps it open).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() "
            "AND state = 'idle' AND query LIKE 'INSERT INTO test_effects%%'"
        )
        assert cursor.fetchall() == [(True,)]

    job = enqueue("tests.record", args={"label": "second"})
    wait_for(lambda: "second" in effects(), message=f"the second job\n{worker.log()[-1500:]}")
    wait_for(lambda: jobs(id=job.job_id)[0]["status"] == "succeeded", message="its end")
    errors = [
        line[:200] for line in worker.log().splitlines() if "retrying" in line or "terminat" in line
    ]
    assert jobs(id=job.job_id)[0]["attempts"] == 1, f"spent an attempt: {errors}"
