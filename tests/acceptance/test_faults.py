"""Fault scenarios with real worker processes, each ending with every safety and liveness
invariant asserted (docs/design.md#invariants).

Fault model — what dies, stalls or races, and the scenario that covers it:

- a worker dies (SIGKILL) while it runs stalled recovery itself (in its maintenance
  thread, holding the try-lock), holding a job, and then a second one dies inside every
  other sweep at once: recovery must not depend on a job that can itself be stalled
  (procrastinate #1408), and every sweep must run again —
  test_a_worker_killed_inside_each_sweep
- a rolling deploy: the old worker drains jobs that outlast the stall threshold while the
  new one runs recovery ticks — test_a_rolling_deploy_runs_no_job_twice
- a statement inside a stage hits the statement timeout (a lock held elsewhere): the
  stage fails, is retried through the normal path and succeeds once —
  test_a_statement_timeout_inside_a_stage_is_retried_and_succeeds_once
- PostgreSQL restarts or terminates the workers' connections (LISTEN included):
  tests/acceptance/test_database_outage.py

Time moves by back-dating rows (heartbeats) wherever the code under test reads a
clock; where a real process must outlive a threshold (a drain), the scenario waits on
that process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from django.db import connection, connections

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from accounts.services import tenant_get_or_create
from pipeline.models import PipelineRun
from pipeline.submit import Upload, anfrage_submit
from queueing.enqueue import Policy, enqueue
from queueing.sweeps import request_sweep, sweeps
from tests.acceptance.slow_sweeps import EFFECTS_DDL
from tests.conftest import jobs, wait_for
from tests.invariants import assert_invariants, assert_live

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

#: Fast clocks for the scenario's workers: beat every 0.5 s, dead after 3 s of silence,
#: recovery every 0.8 s (E003: at most half of 3 s less 1.5 heartbeats less 0.5 s).
FAST = {
    "WORKER_HEARTBEAT_SECONDS": "0.5",
    "STALLED_WORKER_SECONDS": "3",
    "STALLED_RECOVERY_SECONDS": "0.8",
    "STALLED_JOB_MAX_RECOVERIES": "5",
    "PGSTAGE_TASK_MODULES": "tests.queueing.tasks,tests.acceptance.slow_sweeps",
}
LIVE = {"stall_seconds": 3, "recovery_seconds": 1}


@pytest.fixture
def effects(clean_queue):
    with connection.cursor() as cursor:
        cursor.execute(EFFECTS_DDL)
        cursor.execute("TRUNCATE test_effects")

    def read() -> list[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT label FROM test_effects ORDER BY id")
            return [row[0] for row in cursor.fetchall()]

    return read


def kill(worker) -> None:
    os.killpg(worker.process.pid, signal.SIGKILL)
    worker.wait(timeout=10)


def backdate(worker_ids: list[int]) -> None:
    """The killed workers' last heartbeats are a minute old (their silence, time-travelled)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '60 s' "
            "WHERE id = ANY(%s)",
            [worker_ids],
        )


def worker_ids() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM procrastinate_workers")
        return {row[0] for row in cursor.fetchall()}


def test_a_worker_killed_inside_each_sweep(effects, start_worker, tmp_path):
    gates = tmp_path / "gates"
    gates.mkdir()
    # The project's own sweeps (other test modules declare theirs in this process).
    job_sweeps = [
        s.name
        for s in sweeps().values()
        if not s.inline and not s.func.__module__.startswith("tests.")
    ]
    release = tmp_path / "release"
    held = enqueue(
        "tests.block",
        args={"label": "held", "release_file": str(release)},
        key="block:held",
        policy=Policy.EXCLUSIVE,
    )

    # 1. Killed inside stalled recovery (its maintenance loop), while holding a job.
    before = worker_ids()
    first = start_worker(
        env={**FAST, "SLOW_SWEEPS": "stalled_jobs", "SLOW_SWEEPS_DIR": str(gates)},
        concurrency=2,
    )
    wait_for(
        lambda: "held:started" in effects() and "sweep:stalled_jobs:started" in effects(),
        message=f"the first worker inside recovery\n{first.log()[-2000:]}",
    )
    kill(first)
    dead = list(worker_ids() - before)

    # 2. Killed inside every other sweep at once (two workers serving the sweeps queue
    # only: a worker runs at most its thread pool's size of sync jobs at once).
    before = worker_ids()
    slow = {**FAST, "SLOW_SWEEPS": ",".join(job_sweeps), "SLOW_SWEEPS_DIR": str(gates)}
    seconds = [
        start_worker("--queues=sweeps", env=slow, concurrency=len(job_sweeps)) for _ in range(2)
    ]
    dead_sweep_jobs = {name: request_sweep(name).job_id for name in job_sweeps}
    wait_for(
        lambda: all(f"sweep:{n}:started" in effects() for n in job_sweeps),
        message=lambda: (
            f"the workers inside every sweep ({effects()})\n"
            + "\n".join(f"worker {i}:\n{w.log()[-2500:]}" for i, w in enumerate(seconds))
        ),
    )
    for second in seconds:
        kill(second)
    dead.extend(worker_ids() - before)
    assert {jobs(id=j)[0]["status"] for j in dead_sweep_jobs.values()} == {"doing"}
    # While their dead jobs hold the keys, ticks only deduplicate onto them.
    assert all(request_sweep(n).job_id == j for n, j in dead_sweep_jobs.items())

    # 3. A new worker: within one recovery period everything the dead ones held is free.
    backdate(dead)
    rescuer = start_worker(
        env={**FAST, "PGSTAGE_TASK_MODULES": "tests.queueing.tasks"}, concurrency=3
    )
    started = time.monotonic()
    wait_for(
        lambda: all(jobs(id=j)[0]["status"] == "succeeded" for j in dead_sweep_jobs.values()),
        timeout=30,
        message=f"every sweep to run again\n{rescuer.log()[-3000:]}",
    )
    recovered_after = time.monotonic() - started
    release.touch()
    wait_for(
        lambda: jobs(id=held.job_id)[0]["status"] == "succeeded",
        message=f"the held job\n{rescuer.log()[-2000:]}",
    )
    assert effects().count("held:finished") == 1
    # Each sweep takes a fresh job again: no dead holder is left.
    for name in job_sweeps:
        assert request_sweep(name).created or jobs(id=request_sweep(name).job_id)[0]["status"] in (
            "todo",
            "doing",
        )
    assert_invariants()
    assert_live(**LIVE, workers_up_seconds=time.monotonic() - started)
    print(f"\nevery sweep ran again {recovered_after:.1f} s after a worker came back")


def test_a_rolling_deploy_runs_no_job_twice(effects, start_worker, tmp_path):
    """Jobs outlast the stall threshold (3 s) while their old worker drains; recovery
    (every 1 s, in both workers) runs several times meanwhile, finds nothing to take, and
    each job runs once."""
    old = start_worker(env=FAST, concurrency=3, name="old")
    release = tmp_path / "release"
    for n in range(3):
        enqueue(
            "tests.block",
            args={"label": f"long-{n}", "release_file": str(release)},
            key=f"block:long-{n}",
            policy=Policy.EXCLUSIVE,
        )
    wait_for(lambda: sum(e.endswith(":started") for e in effects()) == 3, message="jobs start")
    old.signal(signal.SIGTERM)
    new = start_worker(env=FAST, concurrency=3, name="new")
    # The new worker's recovery runs several times while the drain outlasts the
    # threshold (a real drain: the process under test must keep beating meanwhile).
    runs: set[object] = set()

    def recovery_ran_three_times() -> bool:
        runs.add(_last_recovery())
        return len(runs - {None}) >= 4

    wait_for(
        recovery_ran_three_times,
        timeout=30,
        message=f"recovery to run while the old worker drains\n{new.log()[-2000:]}",
    )
    release.touch()
    assert old.wait(timeout=30) == 0, old.log()
    wait_for(lambda: sum(e.endswith(":finished") for e in effects()) == 3, message="jobs end")
    assert sorted(effects()) == sorted(
        [f"long-{n}:{phase}" for n in range(3) for phase in ("started", "finished")]
    )
    assert {j["status"] for j in jobs(task_name="tests.block")} == {"succeeded"}
    assert_invariants()
    assert_live(**LIVE)


def _last_recovery():
    with connection.cursor() as cursor:
        cursor.execute("SELECT last_run FROM pgstage_inline_sweeps WHERE name = 'stalled_jobs'")
        row = cursor.fetchone()
    return row[0] if row else None


def test_a_statement_timeout_inside_a_stage_is_retried_and_succeeds_once(clean_queue, start_worker):
    """The extract stage's closing transaction waits on a lock held elsewhere until the
    worker's statement timeout (1 s) cancels it; the stage is marked failed, retried
    with backoff, and succeeds once the lock is gone."""
    tenant = tenant_get_or_create(slug="timeouts")
    with connection.cursor() as cursor:
        cursor.execute("BEGIN")
        cursor.execute("LOCK TABLE anfrage_positions IN ACCESS EXCLUSIVE MODE")
        try:
            worker = start_worker(
                env={
                    **FAST,
                    "PGOPTIONS": "-c statement_timeout=1000",
                    "RETRY_BASE_SECONDS": "0.2",
                    "RETRY_CAP_SECONDS": "0.5",
                }
            )
            anfrage = _submit_outside_the_lock(tenant)
            wait_for(
                lambda: _extract_attempts(anfrage.id) >= 2,
                timeout=60,
                message=f"a timed-out extract and its retry\n{worker.log()[-3000:]}",
            )
        finally:
            cursor.execute("ROLLBACK")
    wait_for(
        lambda: PipelineRun.objects.filter(anfrage=anfrage, status="success").count() == 4,
        timeout=60,
        message=f"the pipeline to finish\n{worker.log()[-3000:]}",
    )
    assert "canceling statement due to statement timeout" in worker.log()
    assert_invariants()
    assert_live(**LIVE)


def _submit_outside_the_lock(tenant):
    """Submit on a second connection: the test's own holds the table lock (in a
    transaction that is rolled back)."""
    result = {}

    def submit() -> None:
        try:
            result["anfrage"] = anfrage_submit(
                tenant=tenant,
                actor="test",
                uploads=[Upload(filename="a.txt", data=b"12 pcs steel beam HEA 200, 6 m\n")],
            )
        finally:
            connections.close_all()

    thread = threading.Thread(target=submit)
    thread.start()
    thread.join(timeout=30)
    return result["anfrage"]


def _extract_attempts(anfrage_id: int) -> int:
    run = PipelineRun.objects.filter(anfrage_id=anfrage_id, stage="extract").first()
    return run.attempts if run else 0
