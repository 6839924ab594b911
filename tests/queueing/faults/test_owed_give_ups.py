"""Owed give-up hooks (``pgstage_owed_give_ups``, ``queueing.giveup.settle_owed``) are
taken only by a worker that has the task's hook.

A worker that does not load the task's module (another ``PGSTAGE_TASK_MODULES`` set, a
worker of the previous release during a rolling deploy that adds a hook) leaves the row;
the worker that has the hook runs it. Before the fix, any worker took any row and
deleted it without a hook to run: the hook was lost for good.
"""

from __future__ import annotations

import json

import pytest
from django.db import connection

import tests.queueing.faults.tasks  # noqa: F401  (this process enqueues its jobs)
from queueing.enqueue import enqueue
from tests.conftest import jobs, make_doing, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = {
    "WORKER_HEARTBEAT_SECONDS": "0.5",
    "STALLED_WORKER_SECONDS": "3",
    "STALLED_RECOVERY_SECONDS": "0.8",
}
KNOWS_HOOK = {**FAST, "PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.queueing.faults.tasks"}


def _recovery_runs() -> object:
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_run FROM pgstage_inline_sweeps WHERE name = 'stalled_jobs'")
        row = cursor.fetchone()
        return row[0] if row else None


def _wait_for_recovery_passes(count: int) -> None:
    seen = {_recovery_runs()}
    wait_for(lambda: seen.add(_recovery_runs()) or len(seen) > count, message="passes")


def _owed() -> list:
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id, task_name FROM pgstage_owed_give_ups")
        return cursor.fetchall()


def test_a_worker_without_the_hook_does_not_eat_an_owed_give_up(effects, task_worker):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM pgstage_owed_give_ups")
        # What finish_job_fenced records when a worker that has the task saves its job
        # failed for good (and then dies before its maintenance ran the hook).
        cursor.execute(
            "INSERT INTO pgstage_owed_give_ups (job_id, task_name, args, reason) "
            "VALUES (424242, 'review.fails_once_for_good', %s, 'its job 424242 failed')",
            [json.dumps({"label": "owed"})],
        )
    # A worker that does not load tests.queueing.faults.tasks (no hook for that task).
    other = task_worker(env=FAST, name="other-tasks")
    _wait_for_recovery_passes(3)  # its owed-hook loop runs on the same cadence
    owed_after_other = _owed()

    knowing = task_worker(env=KNOWS_HOOK, name="knows-the-hook")
    try:
        wait_for(lambda: "gave-up:owed" in effects(), timeout=8, message="the owed hook")
    except AssertionError:
        pytest.fail(
            "the owed give-up hook never ran: a worker without the hook deleted the owed "
            f"row (rows after it ran: {owed_after_other}, now: {_owed()})\n"
            + "\n".join(x for x in other.log().splitlines() if "owed" in x)[-600:]
            + f"\n{knowing.log()[-300:]}"
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DELETE FROM pgstage_owed_give_ups")


def test_a_give_up_by_stalled_recovery_in_a_worker_without_the_hook_runs_on_one_with_it(
    effects, task_worker
):
    """Stalled recovery spends a job's stall budget in a worker that lacks the task's
    hook. Before the fix it ran the hook inline (none there), recorded nothing owed, and
    the hook never ran; now the statement that fails the job records the owed hook."""
    job = enqueue("review.fails_once_for_good", args={"label": "stalled"})
    make_doing(job.job_id, heartbeat_age_s=3600)  # its worker died long ago
    other = task_worker(env={**FAST, "STALLED_JOB_MAX_RECOVERIES": "0"}, name="other-tasks")
    wait_for(lambda: jobs()[0]["status"] == "failed", message="recovery gives the job up")
    _wait_for_recovery_passes(3)  # its owed-hook loop runs on the same cadence
    assert _owed() == [(job.job_id, "review.fails_once_for_good")], other.log()[-2000:]
    assert "gave-up:stalled" not in effects()

    task_worker(env=KNOWS_HOOK, name="knows-the-hook")
    wait_for(lambda: "gave-up:stalled" in effects(), message="the owed hook")
    wait_for(lambda: _owed() == [], message="the owed row settled")
    _wait_for_recovery_passes(2)
    assert effects().count("gave-up:stalled") == 1 and "ran:stalled" not in effects()
