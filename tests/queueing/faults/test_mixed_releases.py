"""Mixed releases during a rolling deploy, with real worker subprocesses (docs/deploy.md).

A worker fetches only jobs of the tasks it has. Fault model — while workers of two
releases run side by side:
- the new release adds a task; only old workers run so far:
  test_a_new_task_waits_on_old_workers_and_runs_on_a_new_one (before the fix, an old
  worker fetched its job and failed it for good, TaskNotFound, with no give-up owed);
- the new release removes a task whose jobs still wait; only new workers run:
  test_a_removed_tasks_jobs_wait_visibly_and_a_cancel_settles_them;
- workers listen to different queues, and the one that has a job's task does not listen
  to its queue: test_a_job_on_a_queue_no_worker_with_its_task_listens_to_waits_visibly
  (before the fix: counted as having a worker, never reported).
Each such job is visible: one log line per task name (not per job or per check), the job
admin (``test_admin.py``) and ``/metrics`` (``tests/site``).
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

import tests.queueing.faults.hook_after
import tests.queueing.faults.tasks  # noqa: F401  (this process knows the new release's task)
from queueing.enqueue import enqueue
from queueing.jobs import job_cancel, unrunnable_tasks
from tests.conftest import jobs, wait_for
from tests.queueing.faults.test_owed_give_ups import _wait_for_recovery_passes

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAST = {
    "WORKER_HEARTBEAT_SECONDS": "0.5",
    "STALLED_WORKER_SECONDS": "3",
    "STALLED_RECOVERY_SECONDS": "0.8",
    "UNRUNNABLE_CHECK_SECONDS": "0.5",
    "WORKER_POLLING_SECONDS": "0.5",
}
OLD_RELEASE = {**FAST, "PGSTAGE_TASK_MODULES": "tests.queueing.tasks"}
NEW_RELEASE = {
    **FAST,
    "PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.queueing.faults.tasks",
}


def _owed() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT job_id FROM pgstage_owed_give_ups ORDER BY job_id")
        return [row[0] for row in cursor.fetchall()]


def _waiting_lines(log: str, task_name: str) -> list[str]:
    return [line for line in log.splitlines() if f"of task {task_name} wait" in line]


def test_a_new_task_waits_on_old_workers_and_runs_on_a_new_one(effects, task_worker):
    old = task_worker(env=OLD_RELEASE, name="old-release")
    new_task = enqueue("review.added_in_next_release", args={"label": "n"})
    known = enqueue("tests.record", args={"label": "known"})
    # The old worker runs what it has, and only says, once, that the new task's job waits.
    wait_for(lambda: "known" in effects(), message="the old worker's own job")
    wait_for(
        lambda: _waiting_lines(old.log(), "review.added_in_next_release"),
        message="the old worker's line about the job it cannot run",
    )
    _wait_for_recovery_passes(3)  # several more checks (they run twice as often)
    assert len(_waiting_lines(old.log(), "review.added_in_next_release")) == 1
    by_id = {j["id"]: j for j in jobs()}
    assert by_id[new_task.job_id]["status"] == "todo", old.log()[-2000:]
    assert by_id[new_task.job_id]["attempts"] == 0 and by_id[known.job_id]["status"] == "succeeded"
    assert [u.task_name for u in unrunnable_tasks()] == ["review.added_in_next_release"]
    assert _owed() == [] and "ran:n" not in effects()

    task_worker(env=NEW_RELEASE, name="new-release")
    wait_for(lambda: "ran:n" in effects(), message="the new worker runs the new task's job")
    wait_for(lambda: {j["id"]: j["status"] for j in jobs()}[new_task.job_id] == "succeeded")
    assert effects().count("ran:n") == 1
    assert unrunnable_tasks() == [] and _owed() == []
    wait_for(
        lambda: "jobs of task review.added_in_next_release no longer wait" in old.log(),
        message="the old worker's all-clear",
    )


def test_a_removed_tasks_jobs_wait_visibly_and_a_cancel_settles_them(effects, task_worker):
    new = task_worker(
        env={**FAST, "PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.queueing.faults.retired"},
        name="new-release",
    )
    # A job an old worker of the previous release would have run: no process of this
    # release (this one included) has the task any more.
    # (Renamed in the enqueue's transaction, so the worker never sees it as tests.settled.)
    with transaction.atomic():
        job = enqueue("tests.settled", args={"label": "gone"})
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE procrastinate_jobs SET task_name = 'review.removed' WHERE id = %s",
                [job.job_id],
            )
    wait_for(lambda: _waiting_lines(new.log(), "review.removed"), message="the waiting line")
    [row] = jobs(id=job.job_id)
    assert row["status"] == "todo" and row["attempts"] == 0
    assert [u.task_name for u in unrunnable_tasks()] == ["review.removed"]

    # The operator cancels it (the job admin's action calls the same service): the cancel
    # records the give-up it owes, and the worker that kept the retired task's hook runs it.
    assert job_cancel(job_id=job.job_id, actor="operator") is True
    assert jobs(id=job.job_id)[0]["status"] == "cancelled"
    wait_for(lambda: "gave-up:gone" in effects(), message="the retired task's hook")
    wait_for(lambda: _owed() == [], message="the owed row settled")
    assert effects().count("gave-up:gone") == 1
    assert unrunnable_tasks() == []


def test_a_job_on_a_queue_no_worker_with_its_task_listens_to_waits_visibly(effects, task_worker):
    # One worker has tests.record but listens to the default queue only; the other
    # listens to the runs queue but lacks tests.record.
    on_default = task_worker("--queues=default", env=FAST, name="on-default")
    task_worker(
        "--queues=runs",
        env={**FAST, "PGSTAGE_TASK_MODULES": "runs.tasks"},
        name="on-runs",
    )
    stranded = enqueue("tests.record", args={"label": "stranded"}, queue="runs")
    enqueue("tests.record", args={"label": "served"})
    wait_for(lambda: "served" in effects(), message="the default queue's job")
    wait_for(
        lambda: _waiting_lines(on_default.log(), "tests.record"),
        message="the line about the job no worker takes",
    )
    [line] = _waiting_lines(on_default.log(), "tests.record")
    assert "queue(s) runs" in line
    # (The periodic sweeps' ticks wait too: no worker here listens to their queue.)
    [unrunnable] = [u for u in unrunnable_tasks() if u.task_name == "tests.record"]
    assert (unrunnable.jobs, unrunnable.oldest_job_id, unrunnable.queues) == (
        1,
        stranded.job_id,
        ("runs",),
    )
    assert jobs(id=stranded.job_id)[0]["status"] == "todo" and "stranded" not in effects()

    task_worker("--queues=runs", env=FAST, name="has-it-on-runs")
    wait_for(lambda: "stranded" in effects(), message="a worker that takes it runs it")
    assert "tests.record" not in [u.task_name for u in unrunnable_tasks()]
    wait_for(
        lambda: "jobs of task tests.record no longer wait" in on_default.log(),
        message="the all-clear",
    )


def test_a_hook_added_in_the_new_release_runs_once_for_a_job_an_old_worker_fails(
    effects, task_worker, tmp_path
):
    old = task_worker(
        env={
            **FAST,
            "PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.queueing.faults.hook_before",
        },
        name="old-release",
    )
    gate = tmp_path / "gate"
    job = enqueue("review.gains_a_hook", args={"label": "h", "gate": str(gate)})
    wait_for(lambda: "ran:h" in effects(), message="the old worker runs the job")
    # The new release's worker starts beside it; then the old worker's run fails for good.
    new = task_worker(
        env={
            **FAST,
            "PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.queueing.faults.hook_after",
        },
        name="new-release",
    )
    _wait_for_recovery_passes(1)
    gate.touch()
    wait_for(lambda: jobs(id=job.job_id)[0]["status"] == "failed", message="the job fails")
    wait_for(
        lambda: "gave-up:h" in effects(),
        message=f"the new release's hook\n{old.log()[-1500:]}\n{new.log()[-1500:]}",
    )
    _wait_for_recovery_passes(3)  # no worker runs it again
    assert effects().count("gave-up:h") == 1 and effects().count("ran:h") == 1
    assert _owed() == []
