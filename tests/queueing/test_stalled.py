"""Stalled-work recovery on rows: what it takes back, what it leaves alone, its budget.

Fault model: what can die, stall or race at each step, and the test of each cell (real
worker processes are in ``test_worker.py`` and ``tests/acceptance/test_faults.py``).

A job runs, and
- its worker dies (no heartbeat): test_stalled_job_goes_back_to_todo_without_an_attempt
- its worker is alive: test_live_workers_jobs_are_left_alone
- its worker's row was pruned: test_a_job_without_a_worker_row_is_recovered
- it retried (RetryLater, backoff), then lost its worker:
  test_retries_do_not_spend_the_stall_budget
- its workers keep dying: test_the_stall_budget_fails_the_job_and_settles_its_domain;
  the recovering process lacks the task:
  test_a_give_up_by_recovery_in_a_process_without_the_task_is_owed (with real workers:
  faults/test_owed_give_ups.py); its task has no hook:
  test_a_give_up_of_a_task_without_a_hook_owes_nothing
- an abort was requested, then its worker died: test_an_aborted_stalled_job_is_not_run_again
- the server restarts (every heartbeat is old, the workers alive): acceptance,
  test_a_database_restart_loses_and_repeats_nothing; a crash restart or failover, which
  does not move the server's start time, and any other gap in recovery:
  test_after_a_gap_recovery_waits_one_threshold_before_it_takes_anything; a gap just
  short of a resumption, when the live worker's first beat after it is still due:
  test_a_gap_too_short_to_resume_still_leaves_room_for_the_first_beat_after_it
Recovery requeues it, and
- a fresh job holds its queueing lock (1446/1543):
  test_fresh_job_holding_the_queueing_lock_supersedes_the_stalled_one
Recovery is run by an operator (``manage.py sweep stalled_jobs``, ``sweep --all``, the
admin's *Run now*, a retry of the job) right after a gap that the workers' own recovery
already saw (or that the operator's run is the first to see), while the live worker has not
beaten again yet: test_an_operators_recovery_after_a_gap_keeps_a_live_workers_job
(before, these paths ran the sweep without the clock and took the job: it ran twice);
while a worker's recovery runs: test_an_operators_recovery_beside_a_running_one_skips
Recovery runs, and
- a previous recovery died in ``doing`` (1408): test_a_dead_recovery_job_never_wedges_recovery
- another recovery runs right now: test_two_recovery_ticks_never_overlap
- a sweep's job died holding its key: test_a_dead_sweep_job_is_freed_and_the_sweep_runs_again
- its own worker dies mid-batch: acceptance, test_a_worker_killed_inside_each_sweep
- a backlog of jobs fills every slot: test_worker.py,
  test_recovery_runs_beside_a_backlog_not_behind_it
"""

from __future__ import annotations

import io
import time

import pytest
from django.core.management import call_command
from django.db import connection
from django.urls import reverse
from procrastinate.contrib.django import app

import tests.queueing.tasks  # noqa: F401
from queueing import giveup
from queueing.enqueue import Policy, enqueue
from queueing.jobs import RetryOutcome, job_retry
from queueing.sweeps import request_sweep, run_sweep
from tests.conftest import jobs, make_doing, recovery_ran, registered_worker
from tests.factories import UserFactory
from tests.queueing.conftest import sweep_lock_held
from tests.queueing.tasks import given_up

pytestmark = pytest.mark.django_db(transaction=True)


def stalls(job_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT stalls FROM pgstage_job_stalls WHERE job_id = %s", [job_id])
        row = cursor.fetchone()
    return row[0] if row else 0


def owed() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id FROM pgstage_owed_give_ups ORDER BY job_id")
        return [row[0] for row in cursor.fetchall()]


def test_live_workers_jobs_are_left_alone(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, heartbeat_age_s=1)
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs()[0]["status"] == "doing"


def test_stalled_job_goes_back_to_todo_without_an_attempt(clean_queue):
    """A stall is not a failure of the task: procrastinate's attempts stay as they were."""
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, attempts=2)
    assert run_sweep("stalled_jobs").notes == {"retried": 1}
    [row] = jobs()
    assert (row["status"], row["attempts"], row["worker_id"]) == ("todo", 2, None)
    assert stalls(job.job_id) == 1


def test_a_job_without_a_worker_row_is_recovered(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    worker_id = make_doing(job.job_id, heartbeat_age_s=1)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers WHERE id = %s", [worker_id])
    assert run_sweep("stalled_jobs").notes == {"retried": 1}


def test_retries_do_not_spend_the_stall_budget(clean_queue, settings):
    """A stage that retried six times (RetryLater, backoff) and then loses its worker once
    is recovered, not failed for good."""
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 3
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, attempts=6)
    assert run_sweep("stalled_jobs").notes == {"retried": 1}
    assert jobs()[0]["status"] == "todo"


def test_the_stall_budget_fails_the_job_and_settles_its_domain(effects, settings):
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 2
    job = enqueue("tests.settled", args={"label": "s"})
    for expected in ("retried", "retried", "gave_up"):
        make_doing(job.job_id)
        assert run_sweep("stalled_jobs").notes == {expected: 1}
    [row] = jobs()
    assert row["status"] == "failed" and stalls(job.job_id) == 3
    # The statement that failed it recorded the hook it owes; recovery runs no hook (its
    # worker may lack it), a worker's hooks loop does: once, with the arguments and why.
    assert owed() == [job.job_id] and given_up(effects()) == {}
    assert giveup.settle_owed() == 1 and giveup.settle_owed() == 0
    [(label, reason)] = given_up(effects()).items()
    assert label == "s" and "lost its worker 3 times" in reason
    assert owed() == []


def test_a_give_up_by_recovery_in_a_process_without_the_task_is_owed(effects, settings):
    """The recovering process does not know the task (another release's worker): the
    give-up is recorded all the same, for a process that has the hook."""
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 0
    job = enqueue("tests.settled", args={"label": "elsewhere"})
    make_doing(job.job_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET task_name = 'tests.not_in_this_release' WHERE id = %s",
            [job.job_id],
        )
    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    assert owed() == [job.job_id]
    # This process cannot settle it (it does not know the task): the row waits.
    assert giveup.settle_owed() == 0 and owed() == [job.job_id]


def test_a_give_up_of_a_task_without_a_hook_here_is_recorded_then_settled(clean_queue, settings):
    """A worker of the next release may have the hook: the give-up is recorded all the
    same; with no live worker that has the hook, the row just goes."""
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 0
    job = enqueue("tests.record", args={"label": "no-hook"})
    make_doing(job.job_id)
    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    assert owed() == [job.job_id]
    assert giveup.settle_owed() == 1 and owed() == []


def test_an_owed_hook_waits_for_a_worker_that_has_it_across_an_outage(clean_queue, settings):
    """The database was away longer than the stall threshold: every heartbeat is old, the
    worker that has the hook alive, and it beats again a moment after the return. A
    process that knows the task without the hook, settling first, must not take that
    moment for the hook's worker being gone: the hook would be lost for good."""
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 0
    job = enqueue("tests.record", args={"label": "hook-elsewhere"})
    make_doing(job.job_id)
    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    # Dead for certain after the outage window and four thresholds: 4 + 4 * 2 = 12 s. A
    # silence counts from no earlier than the server's start, so the server must have run
    # longer than that (it has, but for a server just started for this test alone).
    settings.QUEUEING_DATABASE_OUTAGE_SECONDS = 4
    settings.QUEUEING_STALLED_WORKER_SECONDS = 2
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
        (uptime,) = cursor.fetchone()
    time.sleep(max(0.0, 13 - float(uptime)))
    hooked = registered_worker(
        task_names=["tests.record"], hooks=["tests.record"], heartbeat_age_s=10
    )
    recovery_ran(last_run_ago=0, resumed_ago=0)  # recovery saw the gap: it just resumed
    assert giveup.settle_owed() == 0 and owed() == [job.job_id]
    # That worker never came back: once it is dead for certain (silent for longer than
    # any live worker can be: its outage window and four thresholds), the row goes.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '13 seconds' "
            "WHERE id = %s",
            [hooked],
        )
    assert giveup.settle_owed() == 1 and owed() == []


def test_an_owed_hook_runs_at_once_on_a_worker_that_has_it_when_its_last_holder_was_killed(
    effects, settings
):
    """The only worker that registered the hook was SIGKILLed a moment ago (its row is
    fresh, no threshold has passed): a worker that has the hook (its restart) runs the
    owed hook at its next pass — no liveness bound delays a hook's run."""
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 0
    job = enqueue("tests.settled", args={"label": "killed-holder"})
    make_doing(job.job_id)
    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    registered_worker(task_names=["tests.settled"], hooks=["tests.settled"], heartbeat_age_s=1)
    assert giveup.settle_owed() == 1 and owed() == []
    assert "killed-holder" in given_up(effects())


def test_an_owed_hook_waits_for_a_worker_that_has_it_cut_off_alone(clean_queue, settings):
    """Why a process that knows the task without the hook waits longer than the stall
    threshold before it deletes the row: the hook's only worker, cut off alone (a
    partition) while recovery ran all along, is taken for dead by stalled recovery after
    the threshold, but it lives until its outage window and runs the hook when it is
    back. Deleting the row then would lose the hook for good; keeping it costs nothing,
    since no process without the hook could run it."""
    settings.QUEUEING_STALLED_MAX_RECOVERIES = 0
    job = enqueue("tests.record", args={"label": "hook-cut-off"})
    make_doing(job.job_id)  # recovery ran all along: no gap, no resumption
    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    registered_worker(task_names=["tests.record"], hooks=["tests.record"], heartbeat_age_s=120)
    assert giveup.settle_owed() == 0 and owed() == [job.job_id]


def test_an_aborted_stalled_job_is_not_run_again(effects):
    job = enqueue("tests.settled", args={"label": "a"})
    make_doing(job.job_id)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET abort_requested = true WHERE id = %s", [job.job_id]
        )
    assert run_sweep("stalled_jobs").notes == {"aborted": 1}
    assert jobs()[0]["status"] == "aborted" and owed() == [job.job_id]
    giveup.settle_owed()
    assert "a" in given_up(effects())


def test_fresh_job_holding_the_queueing_lock_supersedes_the_stalled_one(clean_queue):
    """procrastinate issues 1446/1543: retrying would violate the queueing-lock index."""
    stalled = enqueue("tests.record", args={"label": "old"}, key="r:1", policy=Policy.SHORT)
    make_doing(stalled.job_id)
    fresh = enqueue("tests.record", args={"label": "new"}, key="r:1", policy=Policy.SHORT)
    assert fresh.created
    other = enqueue("tests.record", args={"label": "other"})
    make_doing(other.job_id)
    result = run_sweep("stalled_jobs")
    # The collision is isolated: the other stalled job in the batch is still retried.
    assert result.notes == {"superseded": 1, "retried": 1} and result.failed == 0
    by_id = {j["id"]: j["status"] for j in jobs()}
    assert by_id == {stalled.job_id: "failed", fresh.job_id: "todo", other.job_id: "todo"}
    assert run_sweep("stalled_jobs").selected == 0


def tick() -> object:
    """One run as a worker's maintenance loop makes it (or an operator's request)."""
    return app.tasks["queueing.sweep_tick.stalled_jobs"](timestamp=0)


@pytest.fixture
def continuous_recovery(clean_queue) -> None:
    """Recovery ran a moment ago and has run without a gap for an hour."""
    recovery_ran(last_run_ago=1, resumed_ago=3600)


def test_after_a_gap_recovery_waits_one_threshold_before_it_takes_anything(clean_queue):
    """A crash restart or a failover does not move pg_postmaster_start_time(): when
    recovery runs again after the gap every heartbeat is old, yet the workers are alive
    and beat again within moments. Silence counts from when recovery resumed."""
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, heartbeat_age_s=120)
    recovery_ran(last_run_ago=600, resumed_ago=86400)  # nothing ran for ten minutes

    assert tick()["changed"] == 0
    # The worker stays silent for a whole threshold after recovery resumed: it is dead.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgstage_inline_sweeps SET resumed_at = resumed_at - interval '60 s'")
    assert tick()["changed"] == 1
    assert jobs()[0]["status"] == "todo"


def test_a_gap_too_short_to_resume_still_leaves_room_for_the_first_beat_after_it(
    clean_queue, settings
):
    """Beat every 10 s, dead after 30 s. The worker's last beat was 15 s (a late one's
    1.5 heartbeats) before a 14.3 s gap; its first beat after the database's return is
    due within the liveness bound (1 s). Recovery runs 0.2 s and 0.9 s after the return:
    neither may take the job (before, a gap under 15 s was no resumption, and the second
    run counted 30.2 s of silence)."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 30
    settings.QUEUEING_HEARTBEAT_SECONDS = 10
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, heartbeat_age_s=15 + 14.3 + 0.2)
    recovery_ran(last_run_ago=14.3 + 0.2, resumed_ago=3600)
    assert run_sweep("stalled_jobs").selected == 0

    with connection.cursor() as cursor:  # 0.7 s later: the beat is still due
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = last_heartbeat - interval '0.7 s'"
        )
        cursor.execute(
            "UPDATE pgstage_inline_sweeps SET last_run = last_run - interval '0.7 s', "
            "resumed_at = resumed_at - interval '0.7 s'"
        )
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs()[0]["status"] == "doing"


def test_a_dead_recovery_job_never_wedges_recovery(continuous_recovery):
    """procrastinate #1408: a recovery that died in 'doing' (an operator's request for one
    run, holding whatever key it was enqueued with) must not stop the next run from
    recovering — itself included."""
    dead_recovery = request_sweep("stalled_jobs")
    make_doing(dead_recovery.job_id)
    lost = enqueue("tests.record", args={"label": "lost"})
    make_doing(lost.job_id)
    counts = tick()
    assert counts["changed"] == 2
    assert {j["id"]: j["status"] for j in jobs()} == {
        dead_recovery.job_id: "todo",
        lost.job_id: "todo",
    }


def test_a_dead_sweep_job_is_freed_and_the_sweep_runs_again(continuous_recovery):
    from tests.queueing.test_sweeps import make_rows  # noqa: F401  (declares test_swept)

    dead = request_sweep("test_swept")
    make_doing(dead.job_id)
    # While its dead job holds the key, ticks only deduplicate onto it ...
    assert request_sweep("test_swept").job_id == dead.job_id
    tick()
    # ... recovery puts it back, and a worker runs it again.
    assert jobs(id=dead.job_id)[0]["status"] == "todo"


def test_two_recovery_ticks_never_overlap(continuous_recovery):
    """While one recovery holds the sweep's try-lock, a second tick skips."""
    with sweep_lock_held("stalled_jobs"):
        job = enqueue("tests.record", args={"label": "x"})
        make_doing(job.job_id)
        assert tick() is None
        assert jobs()[0]["status"] == "doing"
    assert tick()["changed"] == 1


def _operator_runs_recovery(how: str, client) -> str:
    """Run stalled recovery as an operator would; returns what the operator was told."""
    if how in ("command", "command --all"):
        out = io.StringIO()
        args = ["stalled_jobs"] if how == "command" else ["--all"]
        call_command("sweep", *args, stdout=out, stderr=io.StringIO())
        return out.getvalue()
    client.force_login(UserFactory(username="ops", is_staff=True, is_superuser=True))
    response = client.post(
        reverse("admin:queueing_sweeps"), {"sweep": "stalled_jobs", "action": "run"}, follow=True
    )
    return " ".join(str(m) for m in response.context["messages"])


@pytest.mark.parametrize("how", ["command", "command --all", "admin"])
@pytest.mark.parametrize("workers_recovery_saw_the_gap", [True, False])
def test_an_operators_recovery_after_a_gap_keeps_a_live_workers_job(
    clean_queue, client, how, workers_recovery_saw_the_gap
):
    job = enqueue("tests.record", args={"label": "live"})
    # The database was away for 60 s; the job's worker beat just before and, alive, has
    # not beaten again yet (it beats within one heartbeat of the database's return).
    worker_id = make_doing(job.job_id, heartbeat_age_s=61)
    if workers_recovery_saw_the_gap:
        recovery_ran(last_run_ago=0.5, resumed_ago=0.5)  # a worker's run resumed it
    else:
        recovery_ran(last_run_ago=60, resumed_ago=3600)  # the operator's run comes first

    told = _operator_runs_recovery(how, client)

    assert jobs(id=job.job_id)[0]["status"] == "doing", told
    assert jobs(id=job.job_id)[0]["worker_id"] == worker_id
    assert stalls(job.job_id) == 0
    # Once the worker stays silent a whole threshold after recovery resumed, it is dead.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE pgstage_inline_sweeps SET resumed_at = resumed_at - interval '60 s'")
    _operator_runs_recovery(how, client)
    assert jobs(id=job.job_id)[0]["status"] == "todo"


def test_an_operators_recovery_beside_a_running_one_skips(continuous_recovery, client):
    """A worker's recovery holds the try-lock: the command, the admin and a retry of a
    stalled job do not run a second recovery beside it."""
    job = enqueue("tests.record", args={"label": "dead"})
    make_doing(job.job_id)
    with sweep_lock_held("stalled_jobs"):
        assert "skipped: another run holds its lock" in _operator_runs_recovery("command", client)
        assert "is running right now" in _operator_runs_recovery("admin", client)
        retried = job_retry(job_id=job.job_id)
        assert retried.outcome is RetryOutcome.WAITING_FOR_RECOVERY, retried
        assert jobs(id=job.job_id)[0]["status"] == "doing"
    assert job_retry(job_id=job.job_id).outcome is RetryOutcome.RECOVERED
