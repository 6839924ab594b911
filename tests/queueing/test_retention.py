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


def test_a_sweep_with_nothing_to_delete_reads_one_bounded_batch_through_its_index(clean_queue):
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "SELECT 'default', 'tests.record', '{}' FROM generate_series(1, 20000)"
        )
        cursor.execute("UPDATE procrastinate_jobs SET status = 'succeeded'")
        cursor.execute("ANALYZE procrastinate_jobs")
        from queueing.sql import queries

        cursor.execute(
            "EXPLAIN " + queries["finished_jobs"], {"seconds": 3 * 24 * 3600, "limit": 1000}
        )
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "pgstage_jobs_finished_idx" in plan, plan
    # Every job is recent (its insert event is now): nothing goes, whatever the size.
    assert run_sweep("finished_jobs").changed == 0
