"""A worker fetches only jobs of the task names it has (``TaskNameJobManager``).

Fault model: a job waits whose task some worker lacks, and
- that worker fetches: test_a_worker_never_fetches_a_job_of_a_task_it_lacks (before the
  fix: fetched, then failed for good with TaskNotFound, its give-up hook never owed);
- no live worker has the task: test_jobs_no_live_worker_can_run_are_listed_per_task,
  and with real worker subprocesses (both directions of a mixed-release deploy):
  faults/test_mixed_releases.py;
- a job waits on a queue that no live worker having its task listens to:
  test_a_job_on_a_queue_no_worker_with_its_task_listens_to_is_unrunnable (before the fix:
  unreported), with real workers on two queues in faults/test_mixed_releases.py;
- procrastinate's own fetch changes in an upgrade:
  test_the_fetch_judges_each_job_by_procrastinates_conditions, and
  test_the_fetch_takes_the_job_procrastinates_would_among_the_workers_tasks (the same
  job as procrastinate's fetch restricted to the task names, over a random mix of
  priorities, locks, schedules, tasks and queues);
- another fetch in flight holds the best job: test_a_contended_fetch_takes_the_next_free_job;
- many jobs wait for a task no worker has (a deploy's backlog, a removed task):
  test_the_fetch_and_the_unrunnable_count_never_read_other_tasks_waiting_jobs (before
  the fix, each fetch and each /metrics scrape read every waiting job: 31-146 ms at
  100k-200k waiting jobs); the same once the worker's prepared fetch runs on a generic
  plan (PostgreSQL may choose one from its sixth run on):
  test_the_prepared_fetchs_generic_plan_never_reads_other_tasks_waiting_jobs; and both
  while the statistics still say the table holds only finished jobs (a burst after a
  quiet spell; before the fix every fetch read every waiting job twice: the lock check
  as an anti-join over the whole lock index, and the chosen job looked up through the
  waiting jobs' index), and while they say a few dozen rows, mostly finished (the table
  vacuumed after its finished jobs were deleted; before the fix each fetch read 60,006
  rows at 10,000 waiting jobs, 10 ms against 1.8 ms now: 50,000 sorting the waiting jobs
  to list their pairs, as the fetch still does without the planner settings, and 10,002
  finding each pair's first ready job by a walk through procrastinate's priority index
  past the other task's jobs; with the sort disabled but that walk kept, 10,012).
"""

from __future__ import annotations

import random
import re

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from procrastinate.contrib.django import app
from procrastinate.sql import queries as procrastinate_queries

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import enqueue
from queueing.jobs import unrunnable_tasks
from queueing.planner import FETCH_SETTINGS, WALK_SETTINGS
from queueing.sql import queries as queueing_queries
from queueing.worker import TaskNameJobManager, fetch_beat_seconds, fetch_by_task_name, queries
from tests.conftest import database_url, jobs, recovery_ran, registered_worker
from tests.plans import SESSION_ROWS_READ, fetch_statement, rows_read

pytestmark = pytest.mark.django_db(transaction=True)


def _normalized(sql: str) -> str:
    without_comments = re.sub(r"--[^\n]*", "", sql)
    return " ".join(without_comments.split())


def _procrastinate_fetch_function() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_functiondef('procrastinate_fetch_job_v2'::regproc)")
        (definition,) = cursor.fetchone()
    return definition


QUEUE_CONDITION = "AND (target_queue_names IS NULL OR jobs.queue_name = ANY( target_queue_names ))"


def _procrastinate_conditions() -> str:
    """The WHERE clause procrastinate's fetch judges each job by, but for its queues
    (ours are the pairs the loose index scan lists), with its lock check guarded: ``CASE
    WHEN jobs.lock IS NULL THEN true ELSE NOT EXISTS (…) END`` says the same, but the
    planner cannot turn it into an anti-join, which on stale statistics scans the waiting
    jobs' lock index in full for every job it judges
    (test_the_fetch_and_the_unrunnable_count_never_read_other_tasks_waiting_jobs)."""
    body = _normalized(_procrastinate_fetch_function())
    where = body[body.index("FROM procrastinate_jobs AS jobs WHERE") : body.index("ORDER BY")]
    assert QUEUE_CONDITION in where
    where = where.replace(QUEUE_CONDITION + " ", "").strip()
    lock_check = where[where.index("NOT EXISTS (") : where.index(" AND jobs.status = 'todo'")]
    assert lock_check.count("(") == lock_check.count(")"), lock_check
    return where.replace(lock_check, f"CASE WHEN jobs.lock IS NULL THEN true ELSE {lock_check} END")


def _reference_fetch() -> str:
    """procrastinate's candidate selection restricted to the task names, as a read."""
    body = _procrastinate_fetch_function()
    candidate = body[body.index("SELECT jobs.*") : body.index("FOR UPDATE")]
    candidate = candidate.replace("target_queue_names", "%(queues)s::varchar[]")
    return candidate.replace(
        "ORDER BY", "AND jobs.task_name = ANY( %(task_names)s::varchar[] ) ORDER BY"
    )


def test_the_fetch_judges_each_job_by_procrastinates_conditions():
    # The statement of the installed function (pgstage_fetch_job_v1), the one that runs.
    ours = _normalized(fetch_statement())
    pair = "AND jobs.task_name = mine.task_name AND jobs.queue_name = mine.queue_name"
    order = "ORDER BY jobs.priority DESC, jobs.id ASC LIMIT 1"
    judged = f"{_procrastinate_conditions()} {pair} {order}"
    # The unlocked read of each pair's first ready job past its first waiting one, and
    # the locked one under contention.
    assert ours.count(judged) == 2
    # The pair's first waiting job (the loose index scan's), judged the same.
    first = judged.replace(" WHERE ", " WHERE jobs.id = mine.id AND ", 1)
    assert ours.count(first) == 1
    assert "task_name = ANY( %(task_names)s::varchar[] )" in ours
    assert "(%(queues)s::varchar[] IS NULL OR queue_name = ANY( %(queues)s::varchar[] ))" in ours
    # It hands back the columns procrastinate's fetch query does (Job.from_row reads them).
    theirs = procrastinate_queries["fetch_job"]
    columns = theirs[theirs.index("SELECT") : theirs.index("FROM")]
    raw = fetch_statement()
    # The statement's last SELECT (after the deadline's CTE, queueing.timeouts).
    tail = raw[raw.rindex("\nSELECT ") :]
    # Each cast to the type the function declares (migration 0015).
    returned = re.sub(r"::\w+", "", tail[tail.index("SELECT") : tail.index("FROM")])
    assert _normalized(columns) == _normalized(returned)
    # The worker's statement calls the function and hands those columns on, then the
    # commit's synchronous_commit (queueing.flush), which Job.from_row does not read.
    call = queries["fetch_job"]
    assert "pgstage_fetch_job_v1(" in call
    handed = call[call.index("SELECT") : call.index("set_config(")].rstrip(", \n")
    assert _normalized(columns) == _normalized(handed)
    # Given task names only for a worker whose last beat is recent enough, judged when
    # it runs (tests/queueing/test_worker.py shows it takes nothing otherwise).
    assert "THEN %(task_names)s::varchar[] ELSE '{}'::varchar[] END" in _normalized(call)


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
            "INSERT INTO pgstage_worker_tasks (worker_id, task_names)"
            " VALUES (%s, ARRAY['tests.record'])",
            [live],
        )
        # A silent worker that has the other task counts for nothing.
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - interval '1 hour') RETURNING id"
        )
        (silent,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO pgstage_worker_tasks (worker_id, task_names)"
            " VALUES (%s, ARRAY['tests.settled'])",
            [silent],
        )
    [unrunnable] = unrunnable_tasks()
    assert (unrunnable.task_name, unrunnable.jobs, unrunnable.oldest_job_id) == (
        "tests.settled",
        1,
        settled.job_id,
    )


def test_a_worker_silent_only_because_of_an_outage_still_takes_its_tasks(clean_queue):
    """The database was away longer than the stall threshold: every heartbeat is old, yet
    the workers are alive and beat again a moment after the return. Until then their tasks
    are not jobs without a worker (no warning, no /metrics alert, no admin banner), as
    stalled recovery does not take their jobs: silence counts from when it resumed."""
    enqueue("tests.record", args={"label": "a"})
    registered_worker(task_names=["tests.record"], heartbeat_age_s=40)
    recovery_ran(last_run_ago=0, resumed_ago=0)  # recovery saw the gap: it just resumed
    assert unrunnable_tasks() == []
    recovery_ran(last_run_ago=0, resumed_ago=31)  # silent for a threshold since: gone
    assert [u.task_name for u in unrunnable_tasks()] == ["tests.record"]


def test_a_job_on_a_queue_no_worker_with_its_task_listens_to_is_unrunnable(clean_queue):
    on_runs = enqueue("tests.record", args={"label": "r"}, queue="runs")
    enqueue("tests.record", args={"label": "d"})
    enqueue("tests.settled", args={"label": "s"}, queue="runs")
    with connection.cursor() as cursor:
        # One worker has tests.record but listens to the default queue only; another
        # listens to every queue but lacks tests.record.
        for names, queues in ((["tests.record"], ["default"]), (["tests.settled"], None)):
            cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
            (worker,) = cursor.fetchone()
            cursor.execute(
                "INSERT INTO pgstage_worker_tasks (worker_id, task_names, queues)"
                " VALUES (%s, %s, %s)",
                [worker, names, queues],
            )
    [unrunnable] = unrunnable_tasks()
    assert (unrunnable.task_name, unrunnable.jobs, unrunnable.oldest_job_id) == (
        "tests.record",
        1,
        on_runs.job_id,
    )
    assert unrunnable.queues == ("runs",)


def test_registration_records_the_workers_queues(clean_queue):
    manager = fetch_by_task_name(app)
    everywhere = async_to_sync(manager.register_worker)()
    on_two = async_to_sync(manager.register_worker)(["runs", "default"])
    with connection.cursor() as cursor:
        cursor.execute("SELECT worker_id, queues FROM pgstage_worker_tasks ORDER BY worker_id")
        assert cursor.fetchall() == [(everywhere, None), (on_two, ["runs", "default"])]


def _insert_jobs(rows: list[tuple[str, str, int, str | None, int]]) -> None:
    """(task, queue, priority, lock, scheduled in seconds from now) per waiting job."""
    with connection.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO procrastinate_jobs (task_name, queue_name, priority, lock, args,"
            " scheduled_at, status) VALUES (%s, %s, %s, %s, '{}',"
            " now() + %s * interval '1 second', 'todo')",
            rows,
        )


def _reference(task_names: list[str], queues: list[str] | None) -> int | None:
    with connection.cursor() as cursor:
        cursor.execute(_reference_fetch(), {"task_names": task_names, "queues": queues})
        row = cursor.fetchone()
    return row[0] if row else None


def test_the_fetch_takes_the_job_procrastinates_would_among_the_workers_tasks(clean_queue):
    rng = random.Random(21)
    tasks = ["tests.record", "tests.settled", "gone.task"]
    queue_names = ["default", "runs", "other"]
    _insert_jobs(
        [
            (
                rng.choice(tasks),
                rng.choice(queue_names),
                rng.choice([0, 0, 1, 5]),
                rng.choice([None, None, None, "L1", "L2"]),
                rng.choice([-5, -5, -5, 3600]),
            )
            for _ in range(120)
        ]
    )
    with connection.cursor() as cursor:
        # Some locks are held by running jobs.
        cursor.execute(
            "INSERT INTO procrastinate_jobs (task_name, queue_name, lock, args, status)"
            " VALUES ('gone.task', 'other', 'L2', '{}', 'doing')"
        )
    worker_id = _register()
    taken = 0
    for round_ in range(60):
        names = rng.sample(tasks, rng.randint(1, 3))
        queues = rng.choice([None, ["default"], ["runs", "other"]])
        expected = _reference(names, queues)
        manager = TaskNameJobManager(
            connector=app.connector, tasks=lambda names=names: dict.fromkeys(names)
        )
        fetched = async_to_sync(manager.fetch_job)(queues=queues, worker_id=worker_id)
        assert (fetched.id if fetched else None) == expected, (round_, names, queues)
        if fetched and round_ % 3:
            # Finish some, so locks come free and other jobs become first.
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE procrastinate_jobs SET status = 'succeeded' WHERE id = %s",
                    [fetched.id],
                )
        taken += fetched is not None
    assert taken > 20


def test_a_contended_fetch_takes_the_next_free_job(clean_queue):
    _insert_jobs([("tests.record", "default", 0, None, -1)] * 3)
    [first, second, third] = [j["id"] for j in jobs()]
    manager = fetch_by_task_name(app)
    worker_id = _register()
    # Another fetch in flight holds the first job (its row lock, not yet its update).
    with psycopg.connect(database_url(), autocommit=False) as other:
        other.execute("SELECT id FROM procrastinate_jobs WHERE id = %s FOR UPDATE", [first])
        fetched = _fetch(manager, worker_id)
        assert fetched is not None and fetched.id == second
    assert _fetch(manager, worker_id).id == first
    assert _fetch(manager, worker_id).id == third


#: The statistics a burst of waiting jobs meets (see _backlog_of_another_task).
STATISTICS = ["fresh", "finished only", "vacuumed quiet"]


def _backlog_of_another_task(*, stale_statistics: str | bool = False) -> int:
    """5000 waiting jobs of a task this worker lacks, ahead of its own (older, higher
    priority), on two queues, and 5000 of its own task; returns a registered worker's id.
    ``stale_statistics``, what the planner was last told (a quiet queue's state, until
    autovacuum next looks at the burst that followed), so it takes the waiting jobs for
    a handful:

    * ``"finished only"`` (or True): analysed while the table held only finished jobs;
    * ``"vacuumed quiet"``: besides, vacuumed after most of those were deleted, so the
      table's size says a few dozen rows spread over its pages (procrastinate's and
      pgstage's own deletes of finished jobs leave it so)."""
    if stale_statistics is True:
        stale_statistics = "finished only"
    with connection.cursor() as cursor:
        if stale_statistics in ("finished only", "vacuumed quiet"):
            cursor.execute(
                "INSERT INTO procrastinate_jobs (task_name, queue_name, args, status)"
                " SELECT 'tests.record', 'default', '{}', 'succeeded'"
                " FROM generate_series(1, 20000)"
            )
            cursor.execute("ANALYZE procrastinate_jobs")
        if stale_statistics == "vacuumed quiet":
            cursor.execute("DELETE FROM procrastinate_jobs WHERE id % 250 <> 0")
            cursor.execute("VACUUM procrastinate_jobs")
        for task_name, priority in (("gone.task", 9), ("tests.record", 0)):
            cursor.execute(
                "INSERT INTO procrastinate_jobs (task_name, queue_name, priority, args, status)"
                " SELECT %s, CASE WHEN g %% 2 = 0 THEN 'runs' ELSE 'default' END, %s, '{}',"
                " 'todo' FROM generate_series(1, 5000) AS g",
                [task_name, priority],
            )
        if not stale_statistics:
            cursor.execute("ANALYZE procrastinate_jobs")
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker_id,) = cursor.fetchone()
        cursor.execute(
            "INSERT INTO pgstage_worker_tasks (worker_id, task_names)"
            " VALUES (%s, ARRAY['tests.record', 'gone.task'])",
            [worker_id],
        )
    return worker_id


def _fetch_params(worker_id: int, queues: list[str] | None = None) -> dict:
    return {
        "queues": queues,
        "worker_id": worker_id,
        "task_names": ["tests.record"],
        "timeout_tasks": [],
        "timeout_seconds": [],
        "unflushed": [],
        "beat_seconds": fetch_beat_seconds(),
    }


@pytest.mark.parametrize("stale_statistics", [False, "finished only", "vacuumed quiet"])
def test_the_fetch_and_the_unrunnable_count_never_read_other_tasks_waiting_jobs(
    clean_queue, stale_statistics
):
    fetch = _fetch_params(_backlog_of_another_task(stale_statistics=stale_statistics))
    assert rows_read(fetch_statement(), fetch, settings=WALK_SETTINGS) < 50
    # The function itself, on the plan it makes in this session (EXPLAIN sees only the
    # call: the server's counters of this transaction see inside it).
    assert _rows_read_by_the_fetch(fetch) < 50
    assert (
        rows_read(
            queueing_queries["unrunnable_tasks"],
            {"seconds": 30, "clock": "stalled_jobs"},
            settings=WALK_SETTINGS,
        )
        < 50
    )


@pytest.mark.parametrize("stale_statistics", [False, "finished only", "vacuumed quiet"])
@pytest.mark.parametrize("queues", [None, ["runs"]])
def test_the_prepared_fetchs_generic_plan_never_reads_other_tasks_waiting_jobs(
    clean_queue, queues, stale_statistics
):
    """The worker's pool prepares its fetch (``queueing.connector``): from a prepared
    statement's sixth run PostgreSQL may plan it once for any parameters. That plan must
    walk past another task's backlog as the custom one does."""
    fetch = _fetch_params(_backlog_of_another_task(stale_statistics=stale_statistics), queues)
    assert rows_read(fetch_statement(), fetch, settings=FETCH_SETTINGS, generic=True) < 50
    assert _rows_read_by_the_fetch(fetch) < 50


def _rows_read_by_the_fetch(fetch: dict) -> int:
    """Rows the worker's fetch statement (the function) reads, in a transaction rolled
    back (the job it takes stays waiting)."""
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        try:
            cursor.execute(SESSION_ROWS_READ)
            (before,) = cursor.fetchone()
            cursor.execute(queries["fetch_job"], fetch)
            (row,) = cursor.fetchall()
            assert row[0] is not None  # it took a job of its own task
            cursor.execute(SESSION_ROWS_READ)
            (after,) = cursor.fetchone()
        finally:
            cursor.execute("ROLLBACK")
    return int(after - before)
