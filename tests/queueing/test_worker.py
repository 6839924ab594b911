"""Real `manage.py procrastinate worker` subprocesses: transactional enqueue from inside a
task, drain on SIGTERM, and recovery of a SIGKILLed worker's job."""

from __future__ import annotations

import datetime
import logging
import signal
import time

import pytest
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from django.db import connection, transaction

import tests.queueing.tasks  # registers the test tasks in this process
from queueing.enqueue import Policy, enqueue, queueing_lock_for
from queueing.sweeps import run_sweep
from tests.conftest import jobs, make_doing, recovery_ran, wait_for
from tests.queueing.models import Step
from tests.queueing.tasks import given_up

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def statuses() -> dict[str, list[str]]:
    """Statuses of the test tasks' jobs (the workers' own periodic sweeps left out)."""
    out: dict[str, list[str]] = {}
    for job in jobs():
        if job["task_name"].startswith("tests."):
            out.setdefault(job["task_name"], []).append(job["status"])
    return out


def finished(task_name: str) -> int:
    return sum(s in ("succeeded", "failed") for s in statuses().get(task_name, []))


def test_enqueue_inside_a_running_task_commits_and_rolls_back_with_it(effects, task_worker):
    worker = task_worker()
    enqueue("tests.enqueue_child", args={"label": "kept", "fail": False})
    enqueue("tests.enqueue_child", args={"label": "dropped", "fail": True})
    wait_for(
        lambda: finished("tests.enqueue_child") == 2 and finished("tests.record") == 1,
        timeout=30,
        message=f"jobs to finish\n{worker.log()}",
    )
    assert sorted(effects()) == ["kept", "kept-child"]
    # The failing task's business write and its child job rolled back together.
    assert "dropped" not in effects()
    assert [j["args"]["label"] for j in jobs(task_name="tests.record")] == ["kept-child"]
    assert sorted(statuses()["tests.enqueue_child"]) == ["failed", "succeeded"]


class EnqueueCommand(BaseCommand):
    """A management command that writes and enqueues in one transaction."""

    def add_arguments(self, parser):
        parser.add_argument("--label", required=True)
        parser.add_argument("--fail", action="store_true")

    def handle(self, *args, label: str, fail: bool, **options):
        with transaction.atomic():
            tests.queueing.tasks.record(label)
            enqueue("tests.record", args={"label": f"{label}-job"})
            if fail:
                raise CommandError("the business write failed")


def test_enqueue_from_a_command_commits_and_rolls_back_with_it(effects, task_worker):
    call_command(EnqueueCommand(), label="kept")
    with pytest.raises(CommandError):
        call_command(EnqueueCommand(), label="dropped", fail=True)
    assert effects() == ["kept"]
    assert [j["args"]["label"] for j in jobs(task_name="tests.record")] == ["kept-job"]
    # The committed job is a real job: a worker runs it.
    worker = task_worker()
    wait_for(lambda: "kept-job" in effects(), message=f"the job to run\n{worker.log()}")
    assert "dropped-job" not in effects()


def test_sigterm_drains_the_running_job_and_exits_zero(effects, task_worker, tmp_path):
    worker = task_worker()
    release = tmp_path / "release"
    enqueue("tests.block", args={"label": "drain", "release_file": str(release)})
    wait_for(lambda: "drain:started" in effects(), message="job start")
    worker.signal(signal.SIGTERM)
    # After SIGTERM the worker takes no new job...
    enqueue("tests.record", args={"label": "after-sigterm"})
    release.touch()
    assert worker.wait(timeout=30) == 0, worker.log()
    assert effects() == ["drain:started", "drain:finished"]
    assert statuses() == {"tests.block": ["succeeded"], "tests.record": ["todo"]}


def test_sigkilled_workers_job_is_recovered_and_completes_once(effects, task_worker, tmp_path):
    first = task_worker(name="doomed")
    release = tmp_path / "release"
    job = enqueue(
        "tests.block",
        args={"label": "k", "release_file": str(release)},
        key="block:k",
        policy=Policy.EXCLUSIVE,
    )
    wait_for(lambda: "k:started" in effects(), message="job start")
    first.signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert statuses() == {"tests.block": ["doing"]}

    # Not yet stalled: the heartbeat is fresh, recovery leaves the job alone.
    assert run_sweep("stalled_jobs").changed == 0
    # Time travel: the dead worker's last heartbeat is a minute old.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_workers SET last_heartbeat = now() - interval '60 s'")
    recovery_ran(last_run_ago=0, resumed_ago=3600)  # and recovery watched all along
    result = run_sweep("stalled_jobs")
    assert (result.changed, dict(result.notes)) == (1, {"retried": 1})

    release.touch()
    second = task_worker(name="rescuer")
    wait_for(
        lambda: statuses() == {"tests.block": ["succeeded"]}, message=f"recovery\n{second.log()}"
    )
    assert [j["id"] for j in jobs(task_name="tests.block")] == [job.job_id]
    assert effects().count("k:finished") == 1
    assert run_sweep("stalled_jobs").selected == 0


FAST_BEATS = {
    "WORKER_HEARTBEAT_SECONDS": "0.5",
    "STALLED_WORKER_SECONDS": "3",
    "STALLED_RECOVERY_SECONDS": "0.8",
}


def heartbeat_age(worker_id: int) -> float:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT extract(epoch FROM now() - last_heartbeat) FROM procrastinate_workers "
            "WHERE id = %s",
            [worker_id],
        )
        row = cursor.fetchone()
    return float(row[0]) if row else float("inf")


def test_a_draining_worker_keeps_beating_so_no_one_runs_its_job_twice(
    effects, task_worker, tmp_path, settings
):
    """procrastinate's worker stops heart-beating when SIGTERM starts its drain; with a
    stall threshold shorter than the drain, recovery then hands the running job to
    another worker. pgstage's worker beats until its last job has ended."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 3
    draining = task_worker(env=FAST_BEATS, name="draining")
    release = tmp_path / "release"
    enqueue(
        "tests.block",
        args={"label": "d", "release_file": str(release)},
        key="block:d",
        policy=Policy.EXCLUSIVE,
    )
    wait_for(lambda: "d:started" in effects(), message="job start")
    [running] = jobs(task_name="tests.block")
    draining.signal(signal.SIGTERM)
    wait_for(lambda: "Waiting for job to finish" in draining.log(), message="the drain")

    # Time travel: the drain has lasted a minute, far past the stall threshold ...
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_workers SET last_heartbeat = now() - interval '60 s'")
    # ... and the draining worker is still beating, so recovery leaves its job alone.
    wait_for(lambda: heartbeat_age(running["worker_id"]) < 3, message=f"a beat\n{draining.log()}")
    assert run_sweep("stalled_jobs").selected == 0
    # A new worker (the deploy's) starts beside it, and its own recovery ticks find
    # nothing to take either.
    successor = task_worker(env=FAST_BEATS, name="successor")

    release.touch()
    assert draining.wait(timeout=30) == 0, draining.log()
    assert effects() == ["d:started", "d:finished"]
    assert statuses() == {"tests.block": ["succeeded"]}
    assert successor.alive


def test_a_worker_whose_row_was_pruned_registers_again_and_keeps_its_job(
    effects, task_worker, tmp_path, settings
):
    """Another worker pruned this one while it was cut off (its row deleted, its running
    job's worker_id set NULL): it registers again, takes its job back, and recovery
    leaves the job alone."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 3
    worker = task_worker(env=FAST_BEATS)
    release = tmp_path / "release"
    enqueue("tests.block", args={"label": "p", "release_file": str(release)})
    wait_for(lambda: "p:started" in effects(), message="job start")
    [running] = jobs(task_name="tests.block")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers WHERE id = %s", [running["worker_id"]])

    wait_for(lambda: "registered again" in worker.log(), message=f"re-registration\n{worker.log()}")
    [adopted] = jobs(task_name="tests.block")
    assert adopted["worker_id"] not in (None, running["worker_id"])
    # Its new row says which tasks it has: its tasks' jobs do not look unrunnable.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT task_names FROM pgstage_worker_tasks WHERE worker_id = %s",
            [adopted["worker_id"]],
        )
        [(names,)] = cursor.fetchall()
    assert "tests.block" in names
    assert run_sweep("stalled_jobs").selected == 0
    release.touch()
    wait_for(lambda: statuses() == {"tests.block": ["succeeded"]}, message="job end")
    assert effects() == ["p:started", "p:finished"]


def test_a_run_of_a_worker_that_registered_again_claims_and_saves_under_its_new_id(
    effects, task_worker, tmp_path, settings
):
    """The job's run claims its stage after its worker was pruned and registered again
    (its job taken back under the new id): the claim and the fenced save read the
    worker's id as it is now, so the one run does the work and saves its success; no
    poll, no second run. The stall threshold is long (10 s) so that a loaded machine's
    slow re-registration never lets recovery take the job meanwhile."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 10
    worker = task_worker(env={**FAST_BEATS, "STALLED_WORKER_SECONDS": "10"})
    release = tmp_path / "release"
    enqueue("tests.late_stage", args={"unit": "again", "release_file": str(release)})
    wait_for(lambda: "again:started" in effects(), message="job start")
    [running] = jobs(task_name="tests.late_stage")
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers WHERE id = %s", [running["worker_id"]])
    wait_for(lambda: "registered again" in worker.log(), message=f"re-registration\n{worker.log()}")
    release.touch()
    wait_for(
        lambda: statuses() == {"tests.late_stage": ["succeeded"]},
        message=f"job end\n{worker.log()}",
    )
    assert effects() == ["again:started", "again:completed"]
    assert Step.objects.get(unit="again", stage="late").attempts == 1
    assert "PollLater" not in worker.log() and "no longer its job" not in worker.log()


#: One failed fetch, as a connection cut mid-fetch would cause: the first todo -> doing of
#: the job labelled 'poison' raises (a sequence is not rolled back: it raises only once).
POISON_ONCE = """
CREATE SEQUENCE IF NOT EXISTS test_poison_seq;
CREATE OR REPLACE FUNCTION test_poison() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Nested, not AND-ed: SQL does not promise to test the label before nextval().
    IF NEW.args->>'label' = 'poison' THEN
        IF nextval('test_poison_seq') = 1 THEN
            RAISE EXCEPTION 'simulated failed fetch';
        END IF;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS test_poison ON procrastinate_jobs;
CREATE TRIGGER test_poison BEFORE UPDATE OF status ON procrastinate_jobs
    FOR EACH ROW WHEN (OLD.status = 'todo' AND NEW.status = 'doing')
    EXECUTE FUNCTION test_poison();
"""
POISON_DROP = """
DROP TRIGGER IF EXISTS test_poison ON procrastinate_jobs;
DROP FUNCTION IF EXISTS test_poison();
DROP SEQUENCE IF EXISTS test_poison_seq;
"""


@pytest.fixture
def poison_once():
    with connection.cursor() as cursor:
        cursor.execute(POISON_ONCE)
    yield
    with connection.cursor() as cursor:
        cursor.execute(POISON_DROP)


def _orphan(
    worker_id: int, *, label: str, lock: str | None = None, task: str = "tests.record"
) -> int:
    """A job whose fetch committed under ``worker_id`` and whose reply never arrived."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, queueing_lock, "
            "status, worker_id) VALUES ('default', %s, "
            "jsonb_build_object('label', %s::text), %s, 'doing', %s) RETURNING id",
            [task, label, lock, worker_id],
        )
        return cursor.fetchone()[0]


def _the_worker_id() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT id FROM procrastinate_workers")
        [(worker_id,)] = cursor.fetchall()
    return worker_id


def test_orphans_of_a_lost_fetch_reply_go_back_or_end_and_the_worker_goes_on(
    effects, task_worker, poison_once
):
    """Jobs left 'doing' under this live worker by fetches whose reply was lost: after
    the next failed fetch, a plain one goes back to todo and runs, one whose SHORT key a
    fresh job now holds ends failed (superseded), one whose abort was requested ends
    aborted — and the worker keeps taking jobs (none of them wedges its fetch loop)."""
    worker = task_worker(env=FAST_BEATS)
    wait_for(lambda: bool(jobs()) or _workers() == 1, message="registration")
    worker_id = _the_worker_id()
    lock = queueing_lock_for("orphan:1", Policy.SHORT)
    plain = _orphan(worker_id, label="plain")
    colliding = _orphan(worker_id, label="colliding", lock=lock)
    aborted = _orphan(worker_id, label="aborted")
    # Aborted before it ran, and its task has a give-up hook: its domain settles.
    hooked = _orphan(worker_id, label="hooked", task="tests.settled")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET abort_requested = true WHERE id = ANY(%s)",
            [[aborted, hooked]],
        )
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args, queueing_lock, "
            "scheduled_at) VALUES ('default', 'tests.record', '{\"label\": \"fresh\"}', %s, "
            "now() + interval '1 hour')",
            [lock],
        )
    enqueue("tests.record", args={"label": "poison"})
    wait_for(lambda: "simulated failed fetch" in worker.log(), message="the failed fetch")
    enqueue("tests.record", args={"label": "after"})
    wait_for(
        lambda: {"plain", "poison", "after"} <= set(effects()),
        message=f"work after the failed fetch\n{worker.log()[-2000:]}",
    )
    status = {j["id"]: j["status"] for j in jobs()}
    assert (status[plain], status[colliding], status[aborted], status[hooked]) == (
        "succeeded",
        "failed",
        "aborted",
        "aborted",
    )
    wait_for(lambda: "hooked" in given_up(effects()), message="the aborted orphan's hook")
    assert "aborted before it ran" in given_up(effects())["hooked"]
    assert worker.alive


def test_a_job_held_but_not_run_goes_back_without_a_failed_fetch(effects, task_worker, tmp_path):
    """The net for any way to a job 'doing' under a live worker that does not run it
    (stalled recovery never takes it: its worker beats): the fetch loop looks again once
    a stall threshold (3 s here) has passed since its last look, with no fetch failing,
    and puts it back; the job it is running meanwhile stays its own."""
    worker = task_worker(env=FAST_BEATS, concurrency=2)
    first, second = tmp_path / "first", tmp_path / "second"
    long = enqueue(
        "tests.two_phase", args={"label": "long", "first": str(first), "second": str(second)}
    )
    wait_for(lambda: effects().count("long:started") == 1, message="the long run")
    held = _orphan(_the_worker_id(), label="held")
    wait_for(
        lambda: "held" in effects(),
        timeout=20,
        message=f"the held job's run\n{worker.log()[-2000:]}",
    )
    assert f"job {held} was held by this worker, which was not running it" in worker.log()
    assert jobs(id=long.job_id)[0]["status"] == "doing"  # running: not put back
    first.touch()
    wait_for(lambda: jobs(id=long.job_id)[0]["status"] == "succeeded", message="the long end")
    assert effects().count("long:started") == 1
    assert jobs(id=held)[0]["status"] == "succeeded"


def _workers() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM procrastinate_workers")
        return cursor.fetchone()[0]


def test_recovery_runs_beside_a_backlog_not_behind_it(effects, task_worker):
    """Recovery is no job in the queue: a dead worker's job is taken back while the one
    live worker is still busy with a long backlog, not after it."""
    stalled = enqueue(
        "tests.record", args={"label": "stalled"}, key="st:1", policy=Policy.EXCLUSIVE
    )
    make_doing(stalled.job_id, heartbeat_age_s=3600)
    recovery_ran(last_run_ago=0, resumed_ago=3600)
    for i in range(40):
        enqueue("tests.sleep", args={"label": f"backlog-{i}", "seconds": 0.4})
    worker = task_worker(env={**FAST_BEATS, "STALLED_RECOVERY_SECONDS": "0.8"})
    wait_for(
        lambda: jobs(id=stalled.job_id)[0]["status"] != "doing",
        timeout=60,
        message=f"recovery\n{worker.log()[-2000:]}",
    )
    done = sum(label.startswith("backlog-") for label in effects())
    assert done < 40, "the dead worker's job was recovered only after the whole backlog"


def test_a_job_fetched_again_while_its_first_run_goes_on_is_not_run_twice(
    effects, task_worker, tmp_path, settings
):
    """This worker looked dead for a moment, recovery put its running job back, and the
    same worker fetched it again into a free slot: the first run goes on alone and saves
    the outcome; the job's key stays held until it ends."""
    settings.QUEUEING_STALLED_WORKER_SECONDS = 3
    settings.QUEUEING_HEARTBEAT_SECONDS = 0.5  # as FAST_BEATS: recovery's clock needs both
    first, second = tmp_path / "first", tmp_path / "second"
    worker = task_worker(env=FAST_BEATS, concurrency=2)
    job = enqueue(
        "tests.two_phase",
        args={"label": "j", "first": str(first), "second": str(second)},
        key="j:1",
        policy=Policy.EXCLUSIVE,
    )
    wait_for(lambda: effects().count("j:started") == 1, message="the first run")
    while True:
        # The worker looks dead: a minute of silence while recovery watched all along
        # (its next beat waits on this row lock; its own recovery, on the try-lock).
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '60 s'"
            )
            recovery_ran(last_run_ago=0, resumed_ago=3600)
            recovered = run_sweep("stalled_jobs")
        if recovered is not None:  # else the worker's own recovery held the lock
            break
    assert recovered.notes.get("retried", 0) >= 1
    wait_for(
        lambda: "fetched again while this worker still runs it" in worker.log(),
        message=f"the second fetch\n{worker.log()[-1500:]}",
    )
    assert jobs(id=job.job_id)[0]["status"] == "doing"
    assert not enqueue(
        "tests.record", args={"label": "dup"}, key="j:1", policy=Policy.EXCLUSIVE
    ).created
    first.touch()
    second.touch()
    wait_for(lambda: jobs(id=job.job_id)[0]["status"] == "succeeded", message="the end")
    assert effects().count("j:started") == 1 and effects().count("j:finished") == 1


def test_a_job_fetched_again_after_its_first_runs_outcome_was_refused_runs_again(
    effects, monkeypatch, caplog
):
    """The other order of the race above (found by the nemesis: an analysis complete,
    its job 'doing' under a live worker for good): recovery put the running job back,
    the first run ended and its outcome was refused (the job waited then), and only
    then, the first run still listed as running, the same worker fetched the job again.
    Dropping that fetch would leave the job 'doing' under a live worker, which no
    recovery takes back; it waits for the first run, finds the job still its own, and
    runs it again. Driven in this process, so that the interleaving is the test's."""
    import asyncio

    from procrastinate.contrib.django import app

    import tests.queueing.tasks  # noqa: F401  (registers tests.record in this process)

    job = enqueue("tests.record", args={"label": "j"})
    worker_app = app.with_connector(app.connector.get_worker_connector())

    async def scenario() -> str:
        worker = _in_process_worker(worker_app, concurrency=2)
        real = worker._persist_job_status
        runs = []

        async def persist(**kwargs):
            runs.append(kwargs["job"].id)
            if len(runs) > 1:
                return await real(**kwargs)
            connector = worker_app.connector
            # Recovery took the job back while this run went on; it waits (not ready).
            await connector.execute_query_async(
                "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL, "
                "scheduled_at = now() + interval '1 hour' WHERE id = %(id)s",
                id=job.job_id,
            )
            await real(**kwargs)  # refused: the job is not this worker's now
            # Ready again: this worker fetches it while this run is still listed.
            await connector.execute_query_async(
                "UPDATE procrastinate_jobs SET scheduled_at = now() WHERE id = %(id)s",
                id=job.job_id,
            )
            await _until_fetched_by(worker, job.job_id)

        monkeypatch.setattr(worker, "_persist_job_status", persist)
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            status = "todo"
            for _ in range(400):
                row = await worker_app.connector.execute_query_one_async(
                    "SELECT status::text FROM procrastinate_jobs WHERE id = %(id)s",
                    id=job.job_id,
                )
                status = row["status"]
                if status == "succeeded":
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
        return status

    with caplog.at_level(logging.WARNING, logger="queueing.worker"):
        assert asyncio.run(scenario()) == "succeeded"
    assert effects() == ["j", "j"]  # the first run's outcome was refused: a run again
    assert f"job {job.job_id} was fetched again while this worker still runs it" in caplog.text
    assert f"job {job.job_id} was held by this worker, which was not running it" in caplog.text


def test_a_stopped_worker_keeps_its_last_id_for_the_runs_that_outlive_it():
    """A sync run outliving its worker's stop (past the graceful timeout) still fences
    its claims: the id it reads once the worker has stopped (and unregistered) is the
    last one the worker had, never none (a claim with no id would be unfenced; the
    ledger refuses one: tests/queueing/test_ledger.py)."""
    import asyncio

    from procrastinate.contrib.django import app

    worker_app = app.with_connector(app.connector.get_worker_connector())

    async def scenario() -> tuple[int | None, int | None, int | None]:
        worker = _in_process_worker(worker_app, concurrency=1)
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            await _until_registered(worker)
            registered = worker.worker_id
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
        return registered, worker.worker_id, worker._current_worker_id()

    registered, after_stop, read_by_a_run = asyncio.run(scenario())
    assert registered is not None
    assert after_stop is None
    assert read_by_a_run == registered


def test_a_worker_whose_last_beat_is_old_fetches_only_once_it_beats_again(effects, caplog):
    """Found by the nemesis (a worker cut off for a minute): once its link came back, its
    pool fetched a job before its heartbeat had beaten again, and stalled recovery (its
    own) put the job back while it ran, for another worker to run it at the same time. A
    worker whose last beat is older than ``fetch_beat_seconds`` fetches nothing until a
    beat lands: here its heartbeat is held (its link still cut, as far as the heartbeat's
    own connection knows), its clock and its row a minute old; a ready job stays
    'todo' while the worker polls, and runs once the beat has landed."""
    import asyncio

    from procrastinate.contrib.django import app

    from queueing.worker import fetch_beat_seconds

    job = enqueue("tests.record", args={"label": "j"}, schedule_in=datetime.timedelta(hours=1))
    worker_app = app.with_connector(app.connector.get_worker_connector())
    connector = worker_app.connector
    assert fetch_beat_seconds() < 60

    status = _job_status(connector, job.job_id)

    async def scenario() -> tuple[list[str], str]:
        worker = _in_process_worker(worker_app, concurrency=1)

        _hold_heartbeat(worker)
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            await _until_registered(worker)
            # A minute without a beat, as after a partition; the job becomes ready.
            await _a_minute_without_a_beat(worker, job.job_id)
            seen = await _statuses(status)  # the worker polls every 0.05 s meanwhile
            final = await _beat_lands(worker, status)
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
        return seen, final

    with caplog.at_level(logging.INFO, logger="queueing.worker"):
        seen, final = asyncio.run(scenario())
    assert set(seen) == {"todo"}, seen
    assert "fetches again once its heartbeat lands (its last beat was 60 s ago)" in caplog.text
    assert final == "succeeded"
    assert effects() == ["j"]


@pytest.mark.parametrize("held", ["fetch", "look"])
def test_a_fetch_that_reaches_the_server_after_a_minute_of_silence_takes_nothing(effects, held):
    """The wait for a recent beat is the worker's view when it sends the fetch; a link
    that heals (a partition's held bytes, a retransmission) delivers the fetch, or the
    look for held jobs that precedes it, long after. Here that statement is held while the
    worker's beat and row turn a minute old and the job becomes ready, then released: the
    fetch statement judges the beat on the server (the expression stalled recovery
    judges by) and takes nothing; once the beat lands, the job runs."""
    import asyncio

    from procrastinate.contrib.django import app

    from queueing.worker import queries as worker_queries

    job = enqueue("tests.record", args={"label": "j"}, schedule_in=datetime.timedelta(hours=1))
    worker_app = app.with_connector(app.connector.get_worker_connector())
    connector = worker_app.connector

    status = _job_status(connector, job.job_id)

    async def scenario() -> tuple[list[str], str]:
        worker = _in_process_worker(worker_app, concurrency=1)

        _hold_heartbeat(worker)
        holding, sent, heal = False, asyncio.Event(), asyncio.Event()
        method = "execute_query_one_async" if held == "fetch" else "execute_query_all_async"
        real = getattr(connector, method)

        async def through_the_link(query, **arguments):
            nonlocal holding
            if holding and (
                "pgstage_fetch_job_v1" in query
                if held == "fetch"
                else query == worker_queries["orphans"]
            ):
                holding = False
                sent.set()
                await heal.wait()  # the bytes wait in the cut link
            return await real(query, **arguments)

        setattr(connector, method, through_the_link)
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            await _until_registered(worker)
            holding = True
            worker._look_forced = held == "look"  # the next fetch looks first
            await asyncio.wait_for(sent.wait(), timeout=10)
            await _a_minute_without_a_beat(worker, job.job_id)
            heal.set()
            seen = await _statuses(status)
            final = await _beat_lands(worker, status)
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
        return seen, final

    seen, final = asyncio.run(scenario())
    assert set(seen) == {"todo"}, seen
    assert final == "succeeded"
    assert effects() == ["j"]


def test_a_registration_that_was_retried_counts_as_a_beat_from_its_last_attempt():
    """Registering is the worker's first beat (its row is born with ``now()``), and a fetch
    weighs it: when the database was away at start, the beat is the attempt that got
    through, not the first one, or the first fetch would wait for a heartbeat."""
    import asyncio

    from procrastinate import exceptions as procrastinate_exceptions
    from procrastinate.contrib.django import app

    worker_app = app.with_connector(app.connector.get_worker_connector())

    async def scenario() -> tuple[list[float], float]:
        worker = _in_process_worker(worker_app, concurrency=1)
        real = worker.job_manager.register_worker
        attempts: list[float] = []

        async def register(*args, **kwargs):
            attempts.append(time.monotonic())
            if len(attempts) == 1:
                raise procrastinate_exceptions.ConnectorException("the database is away")
            return await real(*args, **kwargs)

        worker.job_manager.register_worker = register
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            await _until_registered(worker)
            beat_sent = worker._beat_sent
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
        worker.job_manager.register_worker = real
        return attempts, beat_sent

    attempts, beat_sent = asyncio.run(scenario())
    assert len(attempts) == 2
    # Taken just before the attempt that got through (the server's now() is no earlier).
    assert attempts[0] < beat_sent <= attempts[1]


def test_registering_again_with_an_id_whose_row_is_there_changes_nothing(caplog):
    """Found by the nemesis (seed 16): a worker cut off for 100 s came back; its heartbeat
    found its row pruned and registered again (13 → 18) while a fetch of its, waiting for
    the beat, still carried the old id; that fetch failed on the missing row, and the
    fetch loop registered again from the id it had now (18 → 19), leaving row 18 behind.
    Registering again happens only when the old row is gone: with the row there, the
    worker keeps its id and writes nothing."""
    import asyncio

    from procrastinate.contrib.django import app

    worker_app = app.with_connector(app.connector.get_worker_connector())
    connector = worker_app.connector

    async def rows() -> int:
        row = await connector.execute_query_one_async(
            "SELECT count(*) AS n FROM procrastinate_workers"
        )
        return row["n"]

    async def scenario() -> tuple[int | None, int | None, int, int]:
        worker = _in_process_worker(worker_app, concurrency=1)
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            await _until_registered(worker)
            registered, before = worker.worker_id, await rows()
            await worker._register_again(registered)
            after_id, after = worker.worker_id, await rows()
            worker.stop()
            await asyncio.wait_for(running, timeout=30)
        return registered, after_id, before, after

    with caplog.at_level(logging.WARNING, logger="queueing.worker"):
        registered, after_id, before, after = asyncio.run(scenario())
    assert after_id == registered
    assert after == before
    assert "registered again" not in caplog.text


def _in_process_worker(worker_app, *, concurrency: int):
    """A pgstage worker in this process (the test drives its interleaving), polling fast."""
    from queueing.worker import PgstageWorker

    return PgstageWorker(
        app=worker_app,
        wait=True,
        listen_notify=False,
        concurrency=concurrency,
        fetch_job_polling_interval=0.05,
        install_signal_handlers=False,
    )


def _job_status(connector, job_id: int):
    """An async callable: the job's status now."""

    async def status() -> str:
        row = await connector.execute_query_one_async(
            "SELECT status::text FROM procrastinate_jobs WHERE id = %(id)s", id=job_id
        )
        return row["status"]

    return status


def _hold_heartbeat(worker) -> None:
    """The in-process ``worker``'s heartbeat gets nowhere (its link cut, as far as the
    heartbeat's own connection knows); the test lands its beats."""
    import asyncio

    async def held() -> None:
        await asyncio.Event().wait()

    worker._update_heartbeat = held


async def _a_minute_without_a_beat(worker, job_id: int) -> None:
    """The worker's last beat and its row a minute old (as after a partition, its
    heartbeat held); the job, scheduled for later, ready now."""
    connector = worker.app.connector
    worker._beat_sent = time.monotonic() - 60
    await connector.execute_query_async(
        "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '60 s' "
        "WHERE id = %(id)s",
        id=worker.worker_id,
    )
    await connector.execute_query_async(
        "UPDATE procrastinate_jobs SET scheduled_at = now() WHERE id = %(id)s", id=job_id
    )


async def _statuses(status, times: int = 20) -> list[str]:
    """The job's status every 0.05 s, ``times`` times (the worker polls as often)."""
    import asyncio

    seen = []
    for _ in range(times):
        await asyncio.sleep(0.05)
        seen.append(await status())
    return seen


async def _beat_lands(worker, status) -> str:
    """The worker's beat lands (as its heartbeat's next attempt would); the job's status
    once it succeeded, or after 10 s."""
    import asyncio

    await worker.app.connector.execute_query_async(
        "UPDATE procrastinate_workers SET last_heartbeat = now() WHERE id = %(id)s",
        id=worker.worker_id,
    )
    worker._beat_sent = time.monotonic()
    final = "todo"
    for _ in range(200):
        final = await status()
        if final == "succeeded":
            break
        await asyncio.sleep(0.05)
    return final


async def _until_registered(worker) -> None:
    """Until the in-process ``worker`` has registered (its id set)."""
    import asyncio

    for _ in range(400):
        if worker.worker_id is not None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the worker did not register within 20 s")


async def _until_fetched_by(worker, job_id: int) -> None:
    """Until the job is 'doing' under ``worker``, and the fetch's reply has reached it."""
    import asyncio

    connector = worker.app.connector
    for _ in range(300):
        row = await connector.execute_query_one_async(
            "SELECT status::text, worker_id FROM procrastinate_jobs WHERE id = %(id)s",
            id=job_id,
        )
        if (row["status"], row["worker_id"]) == ("doing", worker.worker_id):
            await asyncio.sleep(0.3)  # the fetch's reply reaches the worker meanwhile
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} was not fetched again by the worker")


def test_a_job_fetched_again_twice_while_its_first_run_goes_on_runs_once_more(
    effects, monkeypatch, tmp_path
):
    """Two recoveries during one run (the worker looked dead twice): the worker fetched
    the job again after each, the first run's outcome was refused; both later fetches
    are dropped, and the job runs once more, never twice at once."""
    import asyncio

    from procrastinate.contrib.django import app

    import tests.queueing.tasks  # noqa: F401  (registers tests.two_phase in this process)

    first, second = tmp_path / "first", tmp_path / "second"
    first.touch()  # the first run ends at once; a run after it waits for `second`
    job = enqueue(
        "tests.two_phase", args={"label": "j", "first": str(first), "second": str(second)}
    )
    worker_app = app.with_connector(app.connector.get_worker_connector())
    seen: dict[str, list[str]] = {}

    async def labels() -> list[str]:
        rows = await worker_app.connector.execute_query_all_async(
            "SELECT label FROM test_effects ORDER BY id"
        )
        return [row["label"] for row in rows]

    async def scenario() -> None:
        worker = _in_process_worker(worker_app, concurrency=3)
        real = worker._persist_job_status
        runs = []

        async def put_back(when: str) -> None:
            await worker_app.connector.execute_query_async(
                "UPDATE procrastinate_jobs SET status = 'todo', worker_id = NULL, "
                f"scheduled_at = {when} WHERE id = %(id)s",
                id=job.job_id,
            )

        async def persist(**kwargs):
            runs.append(kwargs["job"].id)
            if len(runs) > 1:
                return await real(**kwargs)
            await put_back("now()")  # recovery, and this worker fetches it again
            await _until_fetched_by(worker, job.job_id)
            await put_back("now() + interval '1 hour'")  # recovery again; it waits
            await real(**kwargs)  # refused
            await worker_app.connector.execute_query_async(
                "UPDATE procrastinate_jobs SET scheduled_at = now() WHERE id = %(id)s",
                id=job.job_id,
            )
            await _until_fetched_by(worker, job.job_id)  # a third fetch, this run listed

        monkeypatch.setattr(worker, "_persist_job_status", persist)
        async with worker_app.open_async():
            running = asyncio.create_task(worker.run())
            for _ in range(200):
                if (await labels()).count("j:started") >= 2:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # a twin run would have started by now
            seen["while_the_rerun_waits"] = await labels()
            second.touch()
            for _ in range(200):
                if (await labels()).count("j:finished") >= 2:
                    break
                await asyncio.sleep(0.05)
            worker.stop()
            await asyncio.wait_for(running, timeout=30)

    asyncio.run(scenario())
    assert seen["while_the_rerun_waits"] == ["j:started", "j:finished", "j:started"]
    assert effects() == ["j:started", "j:finished", "j:started", "j:finished"]
    assert jobs(id=job.job_id)[0]["status"] == "succeeded"


def test_a_job_held_but_not_run_goes_back_during_a_backlog(effects, task_worker):
    """The look for jobs held but not run comes before a fetch, so a backlog (which keeps
    procrastinate's fetch loop from starting over) does not put it off."""
    worker = task_worker(env=FAST_BEATS, concurrency=1)
    wait_for(lambda: _workers() == 1, message="registration")
    for i in range(120):
        enqueue("tests.sleep", args={"label": f"backlog-{i}", "seconds": 0.1})
    wait_for(lambda: len(effects()) >= 2, message="the backlog's first jobs")
    held = _orphan(_the_worker_id(), label="held")
    put_back = f"job {held} was held by this worker, which was not running it"
    wait_for(
        lambda: put_back in worker.log(),
        timeout=30,
        message=lambda: f"the held job put back\n{worker.log()[-2000:]}",
    )
    backlog_left = sum(1 for j in jobs() if j["status"] == "todo" and j["id"] != held)
    assert backlog_left > 20, f"put back only once the backlog drained ({backlog_left} left)"
    # Back in line (behind the backlog, by its id), it runs.
    wait_for(lambda: "held" in effects(), timeout=60, message="the held job's run")


def test_a_worker_loop_that_fails_anyway_stops_the_worker_as_a_failure(clean_queue, monkeypatch):
    """Every loop retries what it can; one that still raises (a bug) stops the worker —
    procrastinate would exit 0 then, as if asked to stop — with ``WorkerStopped``, which
    the worker command turns into a non-zero exit, so a supervisor restarts it."""
    import asyncio

    from procrastinate.contrib.django import app

    from queueing.worker import PgstageWorker, WorkerStopped

    async def broken() -> None:
        raise RuntimeError("a bug in a loop")

    # As the worker command runs it: on procrastinate's worker connector (a psycopg pool).
    worker_app = app.with_connector(app.connector.get_worker_connector())

    async def scenario() -> None:
        worker = PgstageWorker(app=worker_app, wait=True, listen_notify=False)

        def a_quiet_loop_and_a_broken_one():
            quiet = asyncio.create_task(asyncio.Event().wait(), name="quiet")
            return [quiet, asyncio.create_task(broken(), name="broken")]

        monkeypatch.setattr(worker, "_start_side_tasks", a_quiet_loop_and_a_broken_one)
        async with worker_app.open_async():
            await asyncio.wait_for(worker.run(), timeout=30)

    with pytest.raises(WorkerStopped, match="its broken loop failed"):
        asyncio.run(scenario())


@pytest.mark.parametrize(
    ("queues", "warned"),
    [(["default"], True), (["default", "sweeps"], False), (None, False), (["sweeps"], False)],
)
def test_a_worker_that_does_not_take_the_sweeps_queue_says_so(caplog, queues, warned):
    """``procrastinate worker --queues default`` leaves the sweeps' jobs (retention, a
    project's own backstops) waiting for ever unless another worker takes their queue:
    the worker says so when it starts, once."""
    from procrastinate import App
    from procrastinate.testing import InMemoryConnector

    from queueing.worker import PgstageWorker

    with caplog.at_level("WARNING", logger="queueing.worker"):
        PgstageWorker(app=App(connector=InMemoryConnector()), queues=queues)

    lines = [r.getMessage() for r in caplog.records if r.name == "queueing.worker"]
    if warned:
        [line] = lines
        assert "'sweeps' queue" in line and "finished_jobs" in line and "--queues" in line
    else:
        assert lines == []


def test_a_job_whose_code_saved_its_success_is_saved_once_and_never_retried(effects, task_worker):
    """``Ledger.complete(..., finish_job=True)`` saves the job's success in the stage's
    closing transaction; the worker then saves nothing, and a raise after it changes
    nothing (said in the log)."""
    worker = task_worker("--delete-jobs=never")
    kept = enqueue("tests.stage_saved", args={"unit": "kept"}).job_id
    raised = enqueue("tests.stage_saved", args={"unit": "raised", "raise_after": True}).job_id
    wait_for(
        lambda: finished("tests.stage_saved") == 2,
        timeout=30,
        message=f"the stage jobs\n{worker.log()}",
    )
    wait_for(lambda: "the saved success stands" in worker.log(), message=worker.log())
    by_id = {j["id"]: j for j in jobs(task_name="tests.stage_saved")}
    assert by_id[kept]["status"] == by_id[raised]["status"] == "succeeded"
    assert by_id[kept]["attempts"] == by_id[raised]["attempts"] == 1
    assert sorted(effects()) == ["kept:completed", "raised:completed"]
    assert "is no longer this worker's" not in worker.log()


def test_a_job_whose_code_saved_its_success_is_deleted_as_the_worker_would(effects, task_worker):
    worker = task_worker("--delete-jobs=successful")
    job = enqueue("tests.stage_saved", args={"unit": "deleted"}).job_id
    wait_for(lambda: effects() == ["deleted:completed"], message=worker.log())
    wait_for(lambda: not [j for j in jobs() if j["id"] == job], message=worker.log())
    assert "is no longer this worker's" not in worker.log()


def test_a_starting_worker_leaves_a_prune_held_by_a_locked_job_for_later(effects, task_worker):
    """A dead worker's job row another session holds locked (a stage's closing transaction
    whose worker vanished before its COMMIT, until the server ends it) would hold the
    prune's ON DELETE SET NULL, and the starting worker with it: the prune gives up after
    its lock timeout and the worker starts and works.

    A silence counts from no earlier than the server's start (prune_dead_workers), so the
    dead worker is due only once the server has run longer than the prune threshold: the
    worker's is 4 + 4 x 3 = 16 s here, and the test waits for a server started just now
    (the embedded one `make test` starts) to have run that long."""
    import psycopg
    from procrastinate.contrib.django.utils import connector_params

    windows = {
        "DATABASE_OUTAGE_SECONDS": "4",
        "STALLED_WORKER_SECONDS": "3",
        "WORKER_HEARTBEAT_SECONDS": "0.5",
        "STALLED_RECOVERY_SECONDS": "0.5",
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM now() - pg_postmaster_start_time())")
        (uptime,) = cursor.fetchone()
    time.sleep(max(0.0, 17 - float(uptime)))
    held = enqueue("tests.record", args={"label": "held"}).job_id
    make_doing(held, heartbeat_age_s=100_000)  # dead for certain: due for the prune
    with psycopg.connect(**connector_params()) as holder:
        holder.execute("SELECT id FROM procrastinate_jobs WHERE id = %s FOR UPDATE", [held])
        worker = task_worker(env=windows)
        enqueue("tests.record", args={"label": "after"})
        wait_for(lambda: "after" in effects(), message=f"a job after the start\n{worker.log()}")
        assert "did not prune dead workers now" in worker.log()
        holder.rollback()
