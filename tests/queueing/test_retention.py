from __future__ import annotations

import pytest
from django.db import connection

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import enqueue
from queueing.sweeps import run_sweep
from tests.conftest import jobs

pytestmark = pytest.mark.django_db(transaction=True)


def finish(job_id: int, status: str, *, age_hours: int) -> None:
    """A job that ended ``age_hours`` ago (its events back-dated)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_jobs SET status = %s WHERE id = %s", [status, job_id])
        cursor.execute(
            "UPDATE procrastinate_events SET at = now() - %s * interval '1 hour' WHERE job_id = %s",
            [age_hours, job_id],
        )


def test_old_finished_jobs_go_failed_and_recent_and_live_ones_stay(clean_queue):
    made = {
        name: enqueue("tests.record", args={"label": name}).job_id
        for name in ("old_ok", "old_cancelled", "old_failed", "recent_ok", "waiting")
    }
    finish(made["old_ok"], "succeeded", age_hours=100)
    finish(made["old_cancelled"], "cancelled", age_hours=100)
    finish(made["old_failed"], "failed", age_hours=100)
    finish(made["recent_ok"], "succeeded", age_hours=1)
    finish(made["waiting"], "todo", age_hours=100)

    result = run_sweep("finished_jobs")
    assert (result.selected, result.changed, result.failed) == (2, 2, 0)
    left = {j["args"]["label"] for j in jobs()}
    assert left == {"old_failed", "recent_ok", "waiting"}
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_events WHERE job_id = ANY(%s)",
            [[made["old_ok"], made["old_cancelled"]]],
        )
        assert cursor.fetchone()[0] == 0
    assert run_sweep("finished_jobs").selected == 0
