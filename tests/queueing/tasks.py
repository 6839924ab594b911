"""Tasks the framework tests run in real worker subprocesses."""

from __future__ import annotations

import time
from pathlib import Path

from django.db import connection, transaction

from queueing.app import task
from queueing.backoff import JitteredBackoff
from queueing.enqueue import Policy, enqueue, job_params
from queueing.exceptions import DoNotRetry, PollLater
from queueing.ledger import Ledger
from tests.queueing.models import Step


def record(label: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO test_effects (label) VALUES (%s)", [label])


@task(name="tests.record")
def record_task(label: str) -> None:
    record(label)


@task(name="tests.enqueue_child")
def enqueue_child(label: str, fail: bool) -> None:
    """Inside a running task: a business write and an enqueue in one transaction."""
    with transaction.atomic():
        record(label)
        enqueue("tests.record", args={"label": f"{label}-child"})
        if fail:
            raise DoNotRetry("rolled back on purpose")


def _wait_for(release_file: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not Path(release_file).exists():
        if time.monotonic() > deadline:
            raise DoNotRetry("release file never appeared")
        time.sleep(0.05)


@task(name="tests.block")
def block(label: str, release_file: str, timeout: float = 60.0) -> None:
    """Record the start (committed), wait until ``release_file`` exists, record the end."""
    record(f"{label}:started")
    _wait_for(release_file, timeout)
    record(f"{label}:finished")


@task(name="tests.outlast")
def outlast(label: str, release_file: str, timeout: float = 120.0) -> None:
    """As ``tests.block``, but its end is recorded on a fresh connection: a run that
    outlasts a database restart succeeds, so only a second *run* shows in its effects."""
    record(f"{label}:started")
    _wait_for(release_file, timeout)
    connection.close()
    record(f"{label}:finished")


def _settle(*, reason: str, label: str, **_: object) -> None:
    record(f"gave-up:{label}:{reason}")


@task(name="tests.settled", on_give_up=_settle)
def settled(label: str, fail: bool = False) -> None:
    """A task with a give-up hook: its domain "settles" (an effect) when a job of it ends
    without doing its work for good."""
    if fail:
        raise RuntimeError(f"{label} failed on purpose")
    record(label)


def given_up(labels: list[str]) -> dict[str, str]:
    """The give-up hooks that ran, label → reason, from the effects' labels."""
    out = {}
    for text in labels:
        if text.startswith("gave-up:"):
            _, label, reason = text.split(":", 2)
            out[label] = reason
    return out


@task(name="tests.sleep")
def sleep(label: str, seconds: float) -> None:
    time.sleep(seconds)
    record(label)


@task(name="tests.two_phase")
def two_phase(label: str, first: str, second: str) -> None:
    """Its first run waits for the file ``first``; a second run (started while the first
    still runs) waits for ``second``."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM test_effects WHERE label = %s", [f"{label}:started"])
        (runs,) = cursor.fetchone()
    record(f"{label}:started")
    release = Path(first if runs == 0 else second)
    deadline = time.monotonic() + 60
    while not release.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    record(f"{label}:finished")


STEPS = Ledger(model=Step, key_fields=("unit", "stage"), lease_seconds=600)


@task(name="tests.stage", claims_first=True)
def stage(unit: str, hold: str) -> None:
    """A stage in the ledger (lease 600 s): its first run to claim holds it until the file
    ``hold`` exists; later runs compute at once. Busy polls (``PollLater``)."""
    claim = STEPS.claim(unit=unit, stage="s")
    if claim.outcome == "done":
        record(f"{unit}:skipped")
        return
    if not claim.claimed:
        raise PollLater(f"stage {unit} is held elsewhere")
    record(f"{unit}:claimed:{claim.token}")
    if claim.token == 1:
        deadline = time.monotonic() + 120
        while not Path(hold).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    with transaction.atomic():
        STEPS.complete(claim)
        record(f"{unit}:completed")


@task(name="tests.stage_hop")
def stage_hop(unit: str) -> None:
    """A stage with no work: claim, then complete, enqueue the next hop (to a queue no
    test worker takes) and save this job's success in one statement."""
    claim = STEPS.claim(unit=unit, stage="hop")
    if claim.claimed:
        STEPS.complete(
            claim,
            then=job_params(
                "tests.record",
                args={"label": unit},
                queue="sink",
                key=f"hop:{unit}",
                policy=Policy.EXCLUSIVE,
            ),
            finish_job=True,
        )


@task(name="tests.late_stage")
def late_stage(unit: str, release_file: str) -> None:
    """A stage that claims only once ``release_file`` exists (or 60 s), then completes
    and saves its job's success in one statement; a refused claim polls."""
    record(f"{unit}:started")
    _wait_for(release_file, 60)
    claim = STEPS.claim(unit=unit, stage="late")
    if not claim.claimed:
        raise PollLater(f"stage {unit} is held elsewhere")
    STEPS.complete(claim, finish_job=True)
    record(f"{unit}:completed")


@task(name="tests.stage_saved", retry=JitteredBackoff(max_attempts=3))
def stage_saved(unit: str, raise_after: bool = False) -> None:
    """A stage that saves its job's success with its complete, then (``raise_after``)
    raises anyway: the saved success must stand, never be retried."""
    claim = STEPS.claim(unit=unit, stage="saved")
    if claim.claimed:
        with transaction.atomic():
            record(f"{unit}:completed")
            STEPS.complete(claim, finish_job=True)
    if raise_after:
        raise RuntimeError("raised after the job's success was saved")


@task(name="tests.hang", timeout=60)
def hang(label: str, release_file: str) -> None:
    """A sync run that hangs until ``release_file`` exists (or 120 s): past its timeout it
    holds its worker's slot, since a thread cannot be stopped."""
    record(f"{label}:started")
    _wait_for(release_file, 120)
    record(f"{label}:finished")


@task(name="tests.poll_forever", timeout=60, retry=JitteredBackoff(max_attempts=2))
def poll_forever(label: str) -> None:
    """Waits on a holder that never lets go."""
    record(f"{label}:polled")
    raise PollLater(f"{label} is held elsewhere", seconds=0.2)
