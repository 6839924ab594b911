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

from tests.conftest import wait_for

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
