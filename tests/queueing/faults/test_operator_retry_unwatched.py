"""An operator's retry of a job stuck in ``doing`` while no recovery runs (no worker is
left, or the database was just away): refused with what to do — not "still
heart-beating", and not taken (a live worker may not have beaten yet). Once a worker's
recovery runs again and the job's worker stays silent past the threshold, the retry
recovers it (as recovery itself would)."""

from __future__ import annotations

import pytest
from django.db import connection

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import Policy, enqueue
from queueing.jobs import RetryOutcome, job_retry
from queueing.sweeps import run_sweep_exclusively
from tests.conftest import jobs

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_an_operator_retry_while_no_recovery_runs_says_what_to_do(clean_queue):
    job = enqueue("tests.record", args={"label": "stuck"}, key="r2:op", policy=Policy.EXCLUSIVE)
    with connection.cursor() as cursor:
        # The only worker died an hour ago, holding the job; so did recovery's last run.
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - interval '1 hour') RETURNING id"
        )
        (dead,) = cursor.fetchone()
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'doing', worker_id = %s WHERE id = %s",
            [dead, job.job_id],
        )
        cursor.execute(
            "INSERT INTO pgstage_inline_sweeps (name, last_run, resumed_at) "
            "VALUES ('stalled_jobs', now() - interval '1 hour', now() - interval '2 hours')"
        )
    refused = job_retry(job_id=job.job_id)
    assert refused.outcome is RetryOutcome.WAITING_FOR_RECOVERY, refused
    assert "Start a worker" in refused.detail and "heart-beating" not in refused.detail
    assert jobs(id=job.job_id)[0]["status"] == "doing"

    # A worker started: its recovery ran (and resumed), then watched one threshold.
    run_sweep_exclusively("stalled_jobs")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE pgstage_inline_sweeps SET resumed_at = now() - interval '1 minute' "
            "WHERE name = 'stalled_jobs'"
        )
    assert job_retry(job_id=job.job_id).outcome is RetryOutcome.RECOVERED
    assert jobs(id=job.job_id)[0]["status"] == "todo"
