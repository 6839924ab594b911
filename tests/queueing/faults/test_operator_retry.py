"""``job_retry`` on a ``doing`` job decides "its worker is dead" by its own rule

Fixed: ``job_for_operator`` reads recovery's clock too. Before that:

(``job_for_operator`` in queueing/sql/queueing.sql: the later of the last heartbeat and the
server's start), not stalled recovery's (which also counts from when recovery *resumed*
after a gap, ``pgstage_inline_sweeps``). Right after a gap — the database or the workers
away, not long enough to move ``pg_postmaster_start_time()`` — recovery correctly leaves a
live worker's job alone, but an operator's retry of the same job "recovers" it and another
worker runs it a second time: test_an_operator_retry_after_a_gap_keeps_a_live_workers_job.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import Policy, enqueue
from queueing.jobs import RetryOutcome, job_retry
from queueing.sweeps import run_sweep
from tests.conftest import jobs, recovery_ran, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_an_operator_retry_after_a_gap_keeps_a_live_workers_job(
    effects, task_worker, tmp_path, settings
):
    settings.QUEUEING_STALLED_WORKER_SECONDS = 30
    defaults = {"WORKER_HEARTBEAT_SECONDS": "10", "STALLED_WORKER_SECONDS": "30"}
    release = tmp_path / "release"
    busy = task_worker(env=defaults, name="busy")
    job = enqueue(
        "tests.block",
        args={"label": "op", "release_file": str(release)},
        key="op:1",
        policy=Policy.EXCLUSIVE,
    )
    wait_for(lambda: "op:started" in effects(), message=f"the job's start\n{busy.log()}")
    [running] = jobs(id=job.job_id)

    with transaction.atomic(), connection.cursor() as cursor:
        # A 60 s gap just ended: the worker's first beat since has not landed (it waits on
        # this row lock); recovery already ran once and recorded that it resumed.
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '60 s' "
            "WHERE id = %s",
            [running["worker_id"]],
        )
        recovery_ran(last_run_ago=60, resumed_ago=60)
        recovery = run_sweep("stalled_jobs")
        assert recovery is not None and recovery.selected == 0  # recovery: alive
        outcome = job_retry(job_id=job.job_id)

    release.touch()
    wait_for(
        lambda: jobs(id=job.job_id)[0]["status"] != "doing" or not busy.alive,
        timeout=10,
        message="the job's end",
    )
    assert outcome.outcome is RetryOutcome.RUNNING, (
        f"the operator's retry took a live worker's running job ({outcome}); it is now "
        f"{jobs(id=job.job_id)[0]['status']}"
    )
