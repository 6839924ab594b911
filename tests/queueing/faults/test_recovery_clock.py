"""Stalled recovery's clock (``pgstage_inline_sweeps``): when is a silent worker dead?

Recovery records that it *resumed* when its previous run is older than the threshold
less 1.5 heartbeats and less the liveness bound (``Sweep.resume_gap_seconds``), and
``stalled_jobs`` counts a worker's silence from the latest of its heartbeat, the server's
start and that resumption:

- a database away for a little less than the threshold (a failover, a network blip: no
  new postmaster) is a gap all the same, so the workers' last beats, up to one heartbeat
  older than the outage, do not make them look dead —
  test_a_database_blip_shorter_than_the_threshold_takes_no_live_workers_job (with the
  resume gap equal to the threshold, the job ran twice);
- a period near that gap would make every run a resumption and nothing would ever be
  recovered: queueing.E003 refuses a period over half the gap, and a lone worker at the
  longest period allowed recovers —
  test_a_recovery_period_that_cannot_watch_continuously_is_refused,
  test_a_lone_worker_at_the_longest_period_allowed_still_recovers.
"""

from __future__ import annotations

import contextlib
import signal

import pytest
from django.db import connection, transaction

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.checks import check_database
from queueing.enqueue import Policy, enqueue
from queueing.sweeps import run_sweep
from tests.conftest import jobs, make_doing, recovery_ran, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _sweep_after_outage(*, worker_id: int, heartbeat_age: float, outage: float) -> None:
    """The first recovery run after the database was away for ``outage`` seconds (its
    last run just before it), while the worker's first beat since has not landed yet (it
    waits on our row lock, as a beat still in its backoff would not have been sent)."""
    while True:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE procrastinate_workers "
                "SET last_heartbeat = now() - %s * interval '1 second' WHERE id = %s",
                [heartbeat_age, worker_id],
            )
            recovery_ran(last_run_ago=outage + 1, resumed_ago=3600)
            if run_sweep("stalled_jobs") is not None:
                return
        # The worker's own maintenance loop held the try-lock: try again.


def test_a_database_blip_shorter_than_the_threshold_takes_no_live_workers_job(
    effects, task_worker, tmp_path, settings
):
    # Production defaults: beat every 10 s, dead after 30 s, recovery every 10 s.
    settings.QUEUEING_STALLED_WORKER_SECONDS = 30
    defaults = {
        "WORKER_HEARTBEAT_SECONDS": "10",
        "STALLED_WORKER_SECONDS": "30",
        "STALLED_RECOVERY_SECONDS": "5",
    }
    release = tmp_path / "release"
    busy = task_worker(env=defaults, name="busy")
    job = enqueue(
        "tests.block",
        args={"label": "o", "release_file": str(release)},
        key="blip:o",
        policy=Policy.EXCLUSIVE,
    )
    wait_for(lambda: "o:started" in effects(), message=f"the job's start\n{busy.log()}")
    [running] = jobs(id=job.job_id)

    # The worker beat 9 s before a 26 s outage (within its 10 s interval); the last
    # recovery ran 1 s before it. No postmaster restart (failover, network blip).
    _sweep_after_outage(worker_id=running["worker_id"], heartbeat_age=35, outage=26)

    # A second worker (e.g. the other replica) is free to take what recovery put back.
    other = task_worker(env=defaults, name="other")
    with contextlib.suppress(AssertionError):  # none: what the worker must see
        wait_for(lambda: effects().count("o:started") > 1, timeout=8, message="a second run")
    release.touch()
    wait_for(
        lambda: jobs(id=job.job_id)[0]["status"] == "succeeded",
        message=f"the job's end\n{busy.log()[-1500:]}\n{other.log()[-1500:]}",
    )
    assert busy.alive
    assert effects().count("o:started") == 1, (
        f"a live worker's running job ran twice after a 26 s outage: {effects()}"
    )


def test_a_recovery_period_that_cannot_watch_continuously_is_refused(settings):
    """A period near the resume gap (threshold less 1.5 heartbeats less the liveness bound:
    3 - 0.75 - 0.5 = 1.75 s here) would make
    every run of a lone worker's loop (sleep + the run's own time) a resumption: refused
    at start (queueing.E003), which leaves half the gap for slow runs."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 3
    settings.QUEUEING_HEARTBEAT_SECONDS = 0.5
    for period in (3, 1.75, 1.7, 0.9):
        settings.QUEUEING_STALLED_RECOVERY_SECONDS = period
        assert [e.id for e in check_database(None)] == ["queueing.E003"], period
    settings.QUEUEING_STALLED_RECOVERY_SECONDS = 0.875
    assert check_database(None) == []


def test_a_lone_worker_at_the_longest_period_allowed_still_recovers(effects, task_worker):
    # A worker died 200 s ago holding a job (not yet pruned: a starting worker prunes rows
    # silent for 300 s + 4 thresholds); recovery had been running all along.
    stalled = enqueue(
        "tests.record", args={"label": "stalled"}, key="eq:1", policy=Policy.EXCLUSIVE
    )
    make_doing(stalled.job_id, heartbeat_age_s=200)
    recovery_ran(last_run_ago=0, resumed_ago=3600)

    # The lone surviving worker: threshold 3 s, heartbeat 0.5 s, so the resume gap is
    # 1.75 s; recovery every 0.875 s, the longest period E003 lets through.
    worker = task_worker(
        env={
            "WORKER_HEARTBEAT_SECONDS": "0.5",
            "STALLED_WORKER_SECONDS": "3",
            "STALLED_RECOVERY_SECONDS": "0.875",
        }
    )
    try:
        wait_for(lambda: "stalled" in effects(), timeout=15, message="recovery")
    except AssertionError:
        pytest.fail(
            f"a dead worker's job was not recovered in 15 s: status "
            f"{jobs(id=stalled.job_id)[0]['status']}; the clock (since last run, since "
            f"resumed): {_clock()}\n{worker.log()[-800:]}"
        )
    worker.signal(signal.SIGTERM)


def _clock() -> tuple:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT now() - last_run, now() - resumed_at FROM pgstage_inline_sweeps "
            "WHERE name = 'stalled_jobs'"
        )
        return cursor.fetchone()
