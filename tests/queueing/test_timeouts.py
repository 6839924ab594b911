"""Job timeouts (``queueing.timeouts``): a run that hangs is ended as a failed attempt, its
late outcome is refused, and a worker whose slots all hold hung runs says so.

Fault model — what can hang, stall or race, and the test that covers it:

- a sync run never returns (its worker heart-beats on):
  test_a_run_past_its_timeout_is_a_failed_attempt_retried_and_its_late_outcome_refused;
  with a real worker, whose only slot it holds:
  test_a_worker_whose_slots_all_hang_says_so_and_its_hung_run_is_fenced_off;
- it hangs on its last attempt:
  test_a_run_past_its_timeout_on_its_last_attempt_fails_owing_its_give_up;
- the hung run's worker fetches the retried job again (same worker id): the same test's
  fence on the attempt, and with a real worker that runs the retry beside the hung run:
  test_the_retry_of_a_hung_run_runs_beside_it_on_the_same_worker;
- the recovering process lacks the task (another release):
  test_a_timed_out_run_of_a_task_this_process_lacks_is_left_to_one_that_has_it;
- the database was away when the deadline passed (a run that ended could not save):
  test_a_deadline_counts_from_when_recovery_resumed;
- an async run never returns: test_an_async_run_past_its_timeout_is_cancelled;
- a job raises PollLater for ever:
  test_a_job_that_polls_for_ever_spends_attempts_past_its_timeout;
- a worker of the release before job timeouts put a dead run's job back (its deadline
  row left) and runs it again at the same attempt:
  test_a_deadline_left_by_a_dead_run_does_not_end_a_pre_timeout_releases_run; this
  release fetches it next:
  test_a_deadline_left_by_a_dead_run_does_not_bound_the_next_runs_polls;
- the run's worker registers again with a new id:
  test_a_run_adopted_by_its_worker_registering_again_keeps_its_deadline;
- the deadline's record: test_the_fetch_records_each_attempts_deadline_on_the_database_clock;
- nonsense settings: test_nonsense_timeouts_are_refused_by_the_checks and the others below.
"""

from __future__ import annotations

import asyncio
import datetime
import types

import pytest
from asgiref.sync import async_to_sync
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from procrastinate.contrib.django import app

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing import timeouts
from queueing.app import task
from queueing.checks import check_database
from queueing.enqueue import enqueue
from queueing.exceptions import JobTimedOut
from queueing.metrics import QueueingMetrics
from queueing.sweeps import run_sweep
from queueing.worker import PgstageWorker, fetch_by_task_name, queries
from tests.conftest import beaten_worker, jobs, make_doing, recovery_ran, wait_for
from tests.queueing.test_worker import FAST_BEATS


def ids(messages) -> list[str]:
    return [m.id for m in messages]


def _deadline(job_id: int, *, attempts: int, ago: float) -> None:
    """The run's deadline, ``ago`` seconds in the past (negative: ahead)."""
    with connection.cursor() as cursor:
        # Time moves for the row's owner too: a row this release's fetch wrote stays its.
        cursor.execute(
            "INSERT INTO pgstage_job_deadlines AS d (job_id, attempts, deadline, run_deadline) "
            "VALUES (%s, %s, now() - %s * interval '1 second', "
            "now() - %s * interval '1 second') ON CONFLICT (job_id) DO UPDATE SET "
            "attempts = EXCLUDED.attempts, deadline = EXCLUDED.deadline, "
            "run_deadline = EXCLUDED.run_deadline, "
            "owned_run_deadline = CASE WHEN d.owned_run_deadline = d.run_deadline "
            "THEN EXCLUDED.run_deadline ELSE d.owned_run_deadline END",
            [job_id, attempts, ago, ago],
        )


def _fenced_finish(job_id: int, worker_id: int, attempts: int) -> list:
    with connection.cursor() as cursor:
        cursor.execute(
            queries["finish_job_fenced"],
            {
                "job_id": job_id,
                "worker_id": worker_id,
                "attempts": attempts,
                "status": "succeeded",
                "delete_job": False,
                "owed_reason": None,
            },
        )
        return cursor.fetchall()


# -- settings and declarations ----------------------------------------------------------


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("QUEUEING_JOB_TIMEOUT_SECONDS", -1),
        ("QUEUEING_JOB_TIMEOUT_SECONDS", float("nan")),
        ("QUEUEING_JOB_TIMEOUT_SECONDS", float("inf")),
        ("QUEUEING_JOB_TIMEOUT_SECONDS", "60"),
        ("QUEUEING_JOB_TIMEOUT_SECONDS", 10),  # shorter than the grace (30 s)
        ("QUEUEING_JOB_TIMEOUT_GRACE_SECONDS", 0),
        ("QUEUEING_JOB_TIMEOUT_GRACE_SECONDS", -5),
        ("QUEUEING_JOB_TIMEOUT_GRACE_SECONDS", None),
    ],
)
def test_nonsense_timeouts_are_refused_by_the_checks(settings, setting, value):
    setattr(settings, setting, value)
    [error] = check_database(None)
    assert error.id == "queueing.E004" and setting in error.msg


@pytest.mark.parametrize("value", [0, None, 30, 86400.5])
def test_a_timeout_of_0_or_none_is_no_bound_and_passes(settings, value):
    settings.QUEUEING_JOB_TIMEOUT_SECONDS = value
    assert check_database(None) == []
    assert timeouts.default_seconds() == (value or 0)


def test_a_tasks_timeout_shorter_than_the_grace_is_refused(settings):
    settings.QUEUEING_JOB_TIMEOUT_GRACE_SECONDS = 90  # tests.hang declares 60 s
    assert "@task(name='tests.hang') timeout=60" in " ".join(
        e.msg for e in check_database(None) if e.id == "queueing.E004"
    )


@pytest.mark.parametrize("value", [-1, float("nan"), "1 minute", True])
def test_a_task_declaring_a_nonsense_timeout_is_refused_at_once(value):
    with pytest.raises(ValueError, match="finite number of seconds"):
        task(name="tests.never_registered", timeout=value)


@pytest.mark.parametrize("value", [0, -2, float("nan"), None])
def test_a_busy_poll_of_0_is_refused(settings, value):
    """0 would make a job waiting on a busy holder poll again at once, in a loop."""
    settings.QUEUEING_BUSY_POLL_SECONDS = value
    assert ids(check_database(None)) == ["queueing.E005"]


# -- the deadline and its recovery ------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_fetch_records_each_attempts_deadline_on_the_database_clock(clean_queue, settings):
    settings.QUEUEING_JOB_TIMEOUT_SECONDS = 0  # tests.record: no bound
    manager = fetch_by_task_name(app)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker,) = cursor.fetchone()
    hang = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    free = enqueue("tests.record", args={"label": "r"}).job_id
    fetched = {async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id for _ in "ab"}
    assert fetched == {hang, free}

    def deadline() -> tuple[int, float] | None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT attempts, extract(epoch FROM deadline - now()) "
                "FROM pgstage_job_deadlines WHERE job_id = %s",
                [hang],
            )
            row = cursor.fetchone()
        return row and (row[0], float(row[1]))

    attempts, ahead = deadline()
    assert attempts == 0 and 59 < ahead <= 60
    assert len(jobs()) == 2 and _count_deadlines() == 1  # tests.record has no bound

    # Polled (the same attempt fetched again): its deadline stays.
    assert _poll(hang, worker) != []
    _deadline(hang, attempts=0, ago=20)
    async_to_sync(manager.fetch_job)(queues=None, worker_id=worker)
    assert deadline()[1] == pytest.approx(-20, abs=1)
    # A new attempt: a whole timeout again.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'todo', attempts = 1 WHERE id = %s", [hang]
        )
    async_to_sync(manager.fetch_job)(queues=None, worker_id=worker)
    attempts, ahead = deadline()
    assert attempts == 1 and 59 < ahead <= 60


def _count_deadlines() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgstage_job_deadlines")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_run_past_its_timeout_is_a_failed_attempt_retried_and_its_late_outcome_refused(
    clean_queue,
):
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)  # a live worker: no stall
    _deadline(job, attempts=0, ago=-60)  # within its timeout
    assert run_sweep("stalled_jobs").selected == 0
    _deadline(job, attempts=0, ago=29)  # past it, within the grace (30 s)
    assert run_sweep("stalled_jobs").selected == 0
    _deadline(job, attempts=0, ago=31)
    result = run_sweep("stalled_jobs")
    assert dict(result.notes) == {"timed_out_retried": 1}
    [row] = jobs(id=job)
    assert (row["status"], row["attempts"]) == ("todo", 1)
    # The same worker fetches the retry: the hung run (attempt 0) still cannot save.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s WHERE id = %s",
            [worker, job],
        )
    assert _fenced_finish(job, worker, attempts=0) == []
    assert jobs(id=job)[0]["status"] == "doing"
    assert _fenced_finish(job, worker, attempts=1) != []


@pytest.mark.django_db(transaction=True)
def test_a_run_past_its_timeout_on_its_last_attempt_fails_owing_its_give_up(clean_queue, settings):
    settings.QUEUEING_RETRY_MAX_ATTEMPTS = 8
    job = enqueue("tests.settled", args={"label": "s"}).job_id
    make_doing(job, attempts=7, heartbeat_age_s=0)
    _deadline(job, attempts=7, ago=3600)
    assert dict(run_sweep("stalled_jobs").notes) == {"timed_out_failed": 1}
    assert jobs(id=job)[0]["status"] == "failed"
    with connection.cursor() as cursor:
        cursor.execute("SELECT reason FROM pgstage_owed_give_ups WHERE job_id = %s", [job])
        [(reason,)] = cursor.fetchall()
    assert "after 8 attempt(s)" in reason and "timeout" in reason


@pytest.mark.django_db(transaction=True)
def test_a_timed_out_run_of_a_task_this_process_lacks_is_left_to_one_that_has_it(clean_queue):
    """Its retry strategy is code this process does not have (another release, other
    task modules): it would have to guess. A process that has the task ends it."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "VALUES ('default', 'elsewhere.task', '{}') RETURNING id"
        )
        (job,) = cursor.fetchone()
    make_doing(job, heartbeat_age_s=0)
    _deadline(job, attempts=0, ago=3600)
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs(id=job)[0]["status"] == "doing"


@pytest.mark.django_db(transaction=True)
def test_a_deadline_counts_from_when_recovery_resumed(clean_queue):
    """The database was away when the deadline passed: a run that ended then could not
    save its outcome. It gets the grace from when recovery resumed."""
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    make_doing(job, heartbeat_age_s=0)
    _deadline(job, attempts=0, ago=3600)
    recovery_ran(last_run_ago=0, resumed_ago=10)
    assert run_sweep("stalled_jobs").selected == 0
    recovery_ran(last_run_ago=0, resumed_ago=31)
    assert dict(run_sweep("stalled_jobs").notes) == {"timed_out_retried": 1}


def test_an_async_run_past_its_timeout_is_cancelled(monkeypatch):
    """An async run can be stopped: its worker cancels it at its timeout, and it fails as
    an attempt with ``JobTimedOut``, as a hung sync run does in recovery; a
    ``TimeoutError`` of the task's own stays what it is."""
    monkeypatch.setattr(timeouts, "timeout_seconds", lambda name: 0.05)
    context = types.SimpleNamespace(
        job=types.SimpleNamespace(id=1), task=types.SimpleNamespace(name="t")
    )

    # The worker itself is not needed: only what its job's code would know of the run.
    worker = types.SimpleNamespace(_job_run=lambda job: None)

    async def forever() -> None:
        await asyncio.sleep(60)

    async def run() -> None:
        await PgstageWorker._in_async_job(worker, forever, context, None)

    started = datetime.datetime.now()
    with pytest.raises(JobTimedOut, match="outlived its timeout"):
        asyncio.run(run())
    assert datetime.datetime.now() - started < datetime.timedelta(seconds=5)

    async def own_timeout() -> None:
        raise TimeoutError("the task's own")

    with pytest.raises(TimeoutError, match="the task's own"):
        asyncio.run(PgstageWorker._in_async_job(worker, own_timeout, context, None))


# -- real workers ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_job_that_polls_for_ever_spends_attempts_past_its_timeout(effects, task_worker):
    """``PollLater`` is no attempt while the run is within its timeout; past it each poll
    is one, so the task's retry strategy (2 attempts) ends it, instead of polling for ever."""
    worker = task_worker(env={**FAST_BEATS, "WORKER_POLLING_SECONDS": "0.2"})
    job = enqueue("tests.poll_forever", args={"label": "p"}).job_id
    wait_for(lambda: effects().count("p:polled") >= 3, message=f"polls\n{worker.log()}")
    assert jobs(id=job)[0]["attempts"] == 0
    _deadline(job, attempts=0, ago=1)
    wait_for(lambda: jobs(id=job)[0]["attempts"] == 1, message=f"attempt 2\n{worker.log()}")
    polled = effects().count("p:polled")
    wait_for(lambda: effects().count("p:polled") >= polled + 3, message="polls again")
    assert jobs(id=job)[0]["status"] in ("todo", "doing")  # a fresh deadline for attempt 2
    _deadline(job, attempts=1, ago=1)
    wait_for(lambda: jobs(id=job)[0]["status"] == "failed", message=f"the end\n{worker.log()}")


def _hung_metrics() -> tuple[float, float]:
    source = QueueingMetrics()
    families = source.families()
    source.collect_live(families)
    return (
        families["pgstage_worker_hung_slots"].samples[()],
        families["pgstage_workers_all_slots_hung"].samples[()],
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_slots_all_hang_says_so_and_its_hung_run_is_fenced_off(
    effects, task_worker, tmp_path, settings, worker_env
):
    settings.WORKER_STATE_DIR = worker_env["WORKER_STATE_DIR"]
    release = tmp_path / "release"
    worker = task_worker(env={**FAST_BEATS, "WORKER_POLLING_SECONDS": "0.2"}, concurrency=1)
    job = enqueue("tests.hang", args={"label": "h", "release_file": str(release)}).job_id
    wait_for(lambda: "h:started" in effects(), message=f"the run\n{worker.log()}")
    call_command("worker_health")  # healthy: its run is within its timeout
    assert _hung_metrics() == (0, 0)

    # Time travel: the run's deadline passed an hour ago (the grace is 30 s), while
    # recovery watched all along.
    _deadline(job, attempts=0, ago=3600)
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    wait_for(lambda: "are held by hung jobs" in worker.log(), message=f"the log\n{worker.log()}")
    assert worker.log().count("are held by hung jobs") == 1  # once per change
    with pytest.raises(CommandError, match=r"all 1 slot.* held by hung jobs"):
        call_command("worker_health")
    assert _hung_metrics() == (1, 1)

    # The worker's own recovery ended the run as a failed attempt; the job is retried,
    # waiting for a free slot.
    wait_for(lambda: jobs(id=job)[0]["attempts"] == 1, message=f"the end\n{worker.log()}")
    assert jobs(id=job)[0]["status"] == "todo"
    # The hung thread returns: its outcome is refused, the retry runs and succeeds.
    release.touch()
    wait_for(lambda: jobs(id=job)[0]["status"] == "succeeded", message=f"the retry\n{worker.log()}")
    assert "is no longer this worker's" in worker.log()
    assert effects().count("h:started") == 2
    wait_for(lambda: "has a free slot again" in worker.log(), message="the free slot")
    call_command("worker_health")
    assert _hung_metrics() == (0, 0)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_retry_of_a_hung_run_runs_beside_it_on_the_same_worker(effects, task_worker, tmp_path):
    """The worker that holds the hung run has a free slot and fetches the retry itself:
    the retry runs (a new attempt, not the hung run fetched twice) and saves its outcome;
    the hung run's, when its thread returns, is refused."""
    first, second = tmp_path / "first", tmp_path / "second"
    worker = task_worker(env={**FAST_BEATS, "WORKER_POLLING_SECONDS": "0.2"}, concurrency=2)
    job = enqueue(
        "tests.two_phase", args={"label": "j", "first": str(first), "second": str(second)}
    ).job_id
    wait_for(lambda: effects().count("j:started") == 1, message="the first run")
    _deadline(job, attempts=0, ago=3600)
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    wait_for(lambda: effects().count("j:started") == 2, message=f"the retry's run\n{worker.log()}")
    second.touch()
    wait_for(lambda: jobs(id=job)[0]["status"] == "succeeded", message="the retry's end")
    assert jobs(id=job)[0]["attempts"] == 2  # procrastinate's finish counts the second
    first.touch()
    wait_for(lambda: "is no longer this worker's" in worker.log(), message="the hung run's end")
    assert effects().count("j:finished") == 2
    assert jobs(id=job)[0]["status"] == "succeeded"
    assert "are held by hung jobs" not in worker.log()  # one slot of two


# -- edges: polls past the deadline, outages at the grace ---------------------------------


def _poll(job_id: int, worker_id: int) -> list:
    with connection.cursor() as cursor:
        cursor.execute(
            queries["poll_job_fenced"],
            {"job_id": job_id, "worker_id": worker_id, "attempts": 0, "retry_at": None},
        )
        return cursor.fetchall()


@pytest.mark.django_db(transaction=True)
def test_a_run_fetched_again_after_its_polls_deadline_is_not_ended_as_it_starts(clean_queue):
    """A job polled (PollLater) shortly before its deadline, then waited behind a backlog
    past the deadline and the grace: its next run has just started and is no hung run."""
    manager = fetch_by_task_name(app)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker,) = cursor.fetchone()
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    assert _poll(job, worker) != []  # within its deadline: it waits, no attempt spent
    _deadline(job, attempts=0, ago=31)  # it waited past its deadline and the grace
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs(id=job)[0]["status"] == "doing"


@pytest.mark.django_db(transaction=True)
def test_a_run_that_ended_at_its_deadline_as_the_database_went_away_may_still_save(
    clean_queue,
):
    """The database went away as a sync run ended at its deadline, and came back after an
    outage as long as recovery's resume gap (14 s with the defaults): recovery did not
    resume (the gap was not longer), so the run's deadline counts as it is; the grace must
    still leave its worker the time to save the outcome (its heartbeat lands, its save
    follows)."""
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    make_doing(job, heartbeat_age_s=14)
    _deadline(job, attempts=0, ago=14)
    recovery_ran(last_run_ago=13.9, resumed_ago=3600)
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs(id=job)[0]["status"] == "doing"


@pytest.mark.django_db(transaction=True)
def test_a_short_grace_still_lets_a_run_that_ended_during_an_unnoticed_outage_save(
    clean_queue, settings
):
    """With a grace of 5 s, an outage of 10 s (shorter than the resume gap, so recovery's
    clock does not resume) would end a run that finished at its deadline as the database
    went away, before its worker could save it: the grace in force is never shorter than
    the resume gap and twice the liveness bound."""
    settings.QUEUEING_JOB_TIMEOUT_GRACE_SECONDS = 5
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    make_doing(job, heartbeat_age_s=10)
    _deadline(job, attempts=0, ago=10)
    recovery_ran(last_run_ago=10, resumed_ago=3600)
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs(id=job)[0]["status"] == "doing"
    _deadline(job, attempts=0, ago=17)  # past the grace in force (16 s)
    assert dict(run_sweep("stalled_jobs").notes) == {"timed_out_retried": 1}


@pytest.mark.parametrize(
    ("grace", "heartbeat", "stalled", "in_force"),
    [(5, 10, 30, 16), (30, 10, 30, 30), (29, 1, 30, 29.5), (30, 10, 120, 106), (2, 1, 3, 2.5)],
)
def test_the_grace_in_force_covers_recoverys_resume_gap_and_the_liveness_bound(
    settings, grace, heartbeat, stalled, in_force
):
    settings.QUEUEING_JOB_TIMEOUT_GRACE_SECONDS = grace
    settings.QUEUEING_HEARTBEAT_SECONDS = heartbeat
    settings.QUEUEING_STALLED_WORKER_SECONDS = stalled
    assert timeouts.grace_seconds() == in_force


def _requeue_and_fetch_as_a_pre_timeout_release(job_id: int) -> int:
    """What a worker of the release before job timeouts does: its stalled recovery puts
    the job back to 'todo' (attempts unchanged) without deleting the dead run's deadline,
    and its fetch (procrastinate's own) takes the job and records none. Its worker id."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL WHERE id = %s",
            [job_id],
        )
    old = beaten_worker(0)  # a live worker
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM procrastinate_fetch_job_v2(%s, %s)", [None, old])
        assert cursor.fetchone() == (job_id,)
    return old


@pytest.mark.django_db(transaction=True)
def test_a_deadline_left_by_a_dead_run_does_not_end_a_pre_timeout_releases_run(clean_queue):
    """A run fetched by this release died; a worker of the release before job timeouts
    recovered its job and runs it again, at the same attempt. The dead run's deadline row
    is still there: it is that run's, not this one's, and ends nothing."""
    manager = fetch_by_task_name(app)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker,) = cursor.fetchone()
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    old = _requeue_and_fetch_as_a_pre_timeout_release(job)
    _deadline(job, attempts=0, ago=3600)  # the dead run's deadline, long past
    assert run_sweep("stalled_jobs").selected == 0
    [row] = jobs(id=job)
    assert (row["status"], row["worker_id"], row["attempts"]) == ("doing", old, 0)


@pytest.mark.django_db(transaction=True)
def test_a_deadline_left_by_a_dead_run_does_not_bound_the_next_runs_polls(clean_queue):
    """The same stale row, then this release fetches the job again at the same attempt:
    its run gets a whole timeout for its polls too, not the dead run's deadline."""
    manager = fetch_by_task_name(app)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker,) = cursor.fetchone()
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    _deadline(job, attempts=0, ago=3600)  # the run died long ago
    with connection.cursor() as cursor:  # a pre-timeout release's recovery: row kept
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL WHERE id = %s",
            [job],
        )
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    assert _poll(job, worker) != []  # within its own deadline: it waits, no attempt spent


@pytest.mark.django_db(transaction=True)
def test_a_run_adopted_by_its_worker_registering_again_keeps_its_deadline(clean_queue):
    """A worker whose row was pruned registers again and takes its runs back: their
    deadlines are its new id's, and a hung one is still ended."""
    manager = fetch_by_task_name(app)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker,) = cursor.fetchone()
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers WHERE id = %s", [worker])  # pruned
        cursor.execute(
            queries["register_and_adopt"],
            {
                "old_worker_id": worker,
                "job_ids": [job],
                "task_names": ["tests.hang"],
                "queues": None,
                "hooks": [],
            },
        )
        (new, registered, adopted) = cursor.fetchone()
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() WHERE id = %s", [new]
        )
    assert registered and new != worker
    assert adopted == [job]
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    _deadline(job, attempts=0, ago=3600)
    assert dict(run_sweep("stalled_jobs").notes) == {"timed_out_retried": 1}


def _fetch_as_the_previous_release(job_id: int) -> int:
    """What a worker of the previous release (migration 0011's, during a rolling deploy)
    does: procrastinate's fetch, then its record of the run's deadline, which writes
    neither ``worker_id`` nor ``polled`` (its statement, as it was). Its worker id."""
    old = beaten_worker(0)  # a live worker
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM procrastinate_fetch_job_v2(%s, %s)", [None, old])
        assert cursor.fetchone() == (job_id,)
        cursor.execute(
            "INSERT INTO pgstage_job_deadlines AS d (job_id, attempts, deadline, run_deadline) "
            "SELECT id, attempts, now() + interval '1 hour', now() + interval '1 hour' "
            "  FROM procrastinate_jobs WHERE id = %s "
            "ON CONFLICT (job_id) DO UPDATE "
            "   SET deadline = CASE WHEN d.attempts = EXCLUDED.attempts THEN d.deadline "
            "                       ELSE EXCLUDED.deadline END, "
            "       run_deadline = EXCLUDED.run_deadline, attempts = EXCLUDED.attempts",
            [job_id],
        )
    return old


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("left", ["polled", "retried"])
def test_a_hung_run_of_the_previous_release_is_ended_whatever_this_release_left(clean_queue, left):
    """During a rolling deploy a job this release fetched (its row: this worker's id, then
    polled, or a failed attempt) is fetched next by a worker of the previous release,
    whose statement leaves ``worker_id`` and ``polled`` as they were. Its run hangs: it is
    the previous release's run, judged as that release judged it, and ended."""
    manager = fetch_by_task_name(app)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
        (worker,) = cursor.fetchone()
    job = enqueue("tests.hang", args={"label": "h", "release_file": "-"}).job_id
    assert async_to_sync(manager.fetch_job)(queues=None, worker_id=worker).id == job
    if left == "polled":
        assert _poll(job, worker) != []
        attempts = 0
    else:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE procrastinate_jobs SET status = 'todo', attempts = 1, worker_id = NULL "
                "WHERE id = %s",
                [job],
            )
        attempts = 1
    old = _fetch_as_the_previous_release(job)
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    _deadline(job, attempts=attempts, ago=3600)
    assert dict(run_sweep("stalled_jobs").notes) == {"timed_out_retried": 1}
    [row] = jobs(id=job)
    assert (row["status"], row["attempts"]) == ("todo", attempts + 1), old
