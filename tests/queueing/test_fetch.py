"""A worker fetches only jobs of the task names it has (``TaskNameJobManager``).

Fault model: a job waits whose task some worker lacks, and
- that worker fetches: test_a_worker_never_fetches_a_job_of_a_task_it_lacks (before the
  fix: fetched, then failed for good with TaskNotFound, its give-up hook never owed);
- no live worker has the task: test_jobs_no_live_worker_can_run_are_listed_per_task,
  and with real worker subprocesses (both directions of a mixed-release deploy):
  faults/test_mixed_releases.py;
- procrastinate's own fetch changes in an upgrade:
  test_the_fetch_is_procrastinates_plus_the_task_names (one statement, as procrastinate's,
  and the same statement but for the task names).
"""

from __future__ import annotations

import re

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from procrastinate.contrib.django import app
from procrastinate.sql import queries as procrastinate_queries

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import enqueue
from queueing.jobs import unrunnable_tasks
from queueing.worker import TaskNameJobManager, fetch_by_task_name, queries
from tests.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def _normalized(sql: str) -> str:
    without_comments = re.sub(r"--[^\n]*", "", sql)
    return " ".join(without_comments.split())


def _procrastinate_fetch() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('procrastinate_fetch_job_v2'::regproc)")
        (definition,) = cursor.fetchone()
    body = definition[definition.index("WITH candidate AS") : definition.index("RETURNING")]
    body = body.replace("target_queue_names", "%(queues)s::varchar[]")
    return _normalized(body.replace("p_worker_id", "%(worker_id)s"))


def test_the_fetch_is_procrastinates_plus_the_task_names():
    ours = queries["fetch_job"]
    task_filter = "AND jobs.task_name = ANY( %(task_names)s::varchar[] )"
    assert task_filter in ours
    fetch = ours[: ours.index("RETURNING")].replace(task_filter, "").replace("), fetched AS (", ")")
    assert _normalized(fetch) == _procrastinate_fetch()
    # It hands back the columns procrastinate's fetch query does (Job.from_row reads them).
    theirs = procrastinate_queries["fetch_job"]
    columns = theirs[theirs.index("SELECT") : theirs.index("FROM")]
    # The statement's last SELECT (after the deadline's CTE, queueing.timeouts).
    tail = ours[ours.rindex("\nSELECT ") :]
    assert _normalized(columns) == _normalized(tail[tail.index("SELECT") : tail.index("FROM")])


def _register() -> int:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        return cursor.fetchone()[0]


def _fetch(manager: TaskNameJobManager, worker_id: int):
    # async_to_sync: the Django connector's queries run on this thread's connection.
    return async_to_sync(manager.fetch_job)(queues=None, worker_id=worker_id)


def test_a_worker_never_fetches_a_job_of_a_task_it_lacks(clean_queue):
    theirs = enqueue("tests.record", args={"label": "new-release"})
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET task_name = 'tests.only_in_the_next_release' "
            "WHERE id = %s",
            [theirs.job_id],
        )
    mine = enqueue("tests.record", args={"label": "mine"})
    manager = fetch_by_task_name(app)
    worker_id = _register()
    fetched = _fetch(manager, worker_id)
    assert fetched is not None and fetched.id == mine.job_id
    assert fetched.task_name == "tests.record" and fetched.worker_id == worker_id
    # Nothing else this worker can run: the other job waits, untouched.
    assert _fetch(manager, worker_id) is None
    assert {j["id"]: j["status"] for j in jobs()} == {theirs.job_id: "todo", mine.job_id: "doing"}


def test_registration_records_the_workers_task_names(clean_queue):
    manager = fetch_by_task_name(app)
    worker_id = async_to_sync(manager.register_worker)()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT task_names FROM pgstage_worker_tasks WHERE worker_id = %s", [worker_id]
        )
        (names,) = cursor.fetchone()
    assert "tests.record" in names and names == sorted(app.tasks)


def test_jobs_no_live_worker_can_run_are_listed_per_task(clean_queue):
    for label in ("a", "b"):
        enqueue("tests.record", args={"label": label})
    settled = enqueue("tests.settled", args={"label": "c"})
    # No worker at all: every waiting job is one no live worker can run.
    assert [(u.task_name, u.jobs) for u in unrunnable_tasks()] == [
        ("tests.record", 2),
        ("tests.settled", 1),
    ]
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (live,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO pgstage_worker_tasks VALUES (%s, ARRAY['tests.record'])", [live]
        )
        # A silent worker that has the other task counts for nothing.
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - interval '1 hour') RETURNING id"
        )
        (silent,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO pgstage_worker_tasks VALUES (%s, ARRAY['tests.settled'])", [silent]
        )
    [unrunnable] = unrunnable_tasks()
    assert (unrunnable.task_name, unrunnable.jobs, unrunnable.oldest_job_id) == (
        "tests.settled",
        1,
        settled.job_id,
    )
