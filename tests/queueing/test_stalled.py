"""Stalled-work recovery on rows (no processes): caps and the queueing-lock collision."""

from __future__ import annotations

import pytest
from django.db import connection

import tests.queueing.tasks  # noqa: F401
from queueing.enqueue import Policy, enqueue
from queueing.sweeps import run_sweep
from tests.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def make_doing(job_id: int, *, attempts: int = 0, heartbeat_age_s: int = 120) -> None:
    """A job claimed by a worker whose heartbeat is ``heartbeat_age_s`` old."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - %s * interval '1 second') RETURNING id",
            [heartbeat_age_s],
        )
        (worker_id,) = cursor.fetchone()
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s, attempts = %s "
            "WHERE id = %s",
            [worker_id, attempts, job_id],
        )


def test_live_workers_jobs_are_left_alone(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, heartbeat_age_s=1)
    assert run_sweep("stalled_jobs").selected == 0
    assert jobs()[0]["status"] == "doing"


def test_stalled_job_goes_back_to_todo(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id)
    assert run_sweep("stalled_jobs").notes == {"retried": 1}
    assert jobs()[0]["status"] == "todo" and jobs()[0]["attempts"] == 1


def test_attempts_are_capped(clean_queue, settings):
    settings.QUEUEING_STALLED_MAX_ATTEMPTS = 3
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, attempts=2)
    assert run_sweep("stalled_jobs").notes == {"gave_up": 1}
    assert jobs()[0]["status"] == "failed"


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
