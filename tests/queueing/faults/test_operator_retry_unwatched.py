"""An operator's retry of a job stuck in ``doing`` while no recovery runs (no worker is
left, or the database was just away): refused with what to do — not "still
heart-beating", and not taken (a live worker may not have beaten yet). Once a worker's
recovery runs again and the job's worker stays silent past the threshold, the retry
recovers it (as recovery itself would)."""

from __future__ import annotations

import pytest

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import Policy, enqueue
from queueing.jobs import RetryOutcome, job_retry
from queueing.sweeps import run_sweep
from tests.conftest import jobs, make_doing, recovery_ran

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_an_operator_retry_while_no_recovery_runs_says_what_to_do(clean_queue):
    job = enqueue("tests.record", args={"label": "stuck"}, key="r2:op", policy=Policy.EXCLUSIVE)
    # The only worker died an hour ago, holding the job; so did recovery's last run.
    make_doing(job.job_id, heartbeat_age_s=3600)
    recovery_ran(last_run_ago=3600, resumed_ago=7200)
    refused = job_retry(job_id=job.job_id)
    assert refused.outcome is RetryOutcome.WAITING_FOR_RECOVERY, refused
    assert "Start a worker" in refused.detail and "heart-beating" not in refused.detail
    assert jobs(id=job.job_id)[0]["status"] == "doing"

    # A worker started: its recovery ran (and resumed), then watched one threshold.
    run_sweep("stalled_jobs")
    recovery_ran(last_run_ago=0, resumed_ago=60)
    assert job_retry(job_id=job.job_id).outcome is RetryOutcome.RECOVERED
    assert jobs(id=job.job_id)[0]["status"] == "todo"
