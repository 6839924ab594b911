"""A stage whose holder's worker died is taken over within the stall threshold, not at
the end of its lease, and waiting on a busy stage costs no attempt.

Fault model — a worker holds a stage (ledger lease 600 s) and is SIGKILLed mid-stage:
- its job is taken back by stalled recovery and runs again on another worker, and a
  second job of the same stage is waiting on it (busy): both done within the threshold
  plus a short bound, the stage completed once, neither job spending an attempt
  (test_a_killed_holders_stage_is_taken_over_within_the_stall_threshold). Before the fix,
  the lease held the stage for 600 s and each busy retry spent an attempt with backoff.
"""

from __future__ import annotations

import os
import signal

import pytest

import tests.queueing.tasks  # noqa: F401  (this process enqueues the stage jobs)
from queueing.enqueue import enqueue
from tests.conftest import jobs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STALLED_SECONDS = 3
FAST = {
    "WORKER_HEARTBEAT_SECONDS": "0.5",
    "STALLED_WORKER_SECONDS": str(STALLED_SECONDS),
    "STALLED_RECOVERY_SECONDS": "0.8",
    "WORKER_POLLING_SECONDS": "0.5",
    "BUSY_POLL_SECONDS": "0.5",
    # Before the fix, busy retries spent these and failed the waiting job for good.
    "RETRY_MAX_ATTEMPTS": "3",
    "RETRY_BASE_SECONDS": "1",
}
#: The takeover's bound beyond the stall threshold: recovery's period, a poll, a fetch
#: and the stage's own commit, on a loaded test machine — far below the 600 s lease.
BOUND_SECONDS = 30


def test_a_killed_holders_stage_is_taken_over_within_the_stall_threshold(
    effects, task_worker, tmp_path
):
    hold = str(tmp_path / "never")  # the first holder never finishes by itself
    holder = task_worker(env=FAST, name="holder")
    first = enqueue("tests.stage", args={"unit": "u", "hold": hold})
    wait_for(lambda: "u:claimed:1" in effects(), message="the first claim")
    # A second job of the same stage waits on the holder (busy), on another worker.
    task_worker(env=FAST, name="survivor")
    second = enqueue("tests.stage", args={"unit": "u", "hold": hold})
    wait_for(lambda: "polls again" in _log(tmp_path), message="the second job polling")

    os.killpg(holder.process.pid, signal.SIGKILL)
    holder.wait(timeout=10)
    wait_for(
        lambda: "u:completed" in effects(),
        timeout=STALLED_SECONDS + BOUND_SECONDS,
        message="the stage taken over and completed",
    )
    wait_for(
        lambda: {j["status"] for j in jobs() if j["task_name"] == "tests.stage"} == {"succeeded"},
        timeout=BOUND_SECONDS,
        message="both jobs done",
    )
    labels = effects()
    assert labels.count("u:completed") == 1, labels
    assert labels.count("u:claimed:2") == 1 and "u:claimed:3" not in labels, labels
    # Waiting on the live holder, and polling until recovery declared it dead, cost
    # neither job an attempt: each counts only the run that finished it (procrastinate
    # counts that one), and recovery counts none.
    attempts = {j["id"]: j["attempts"] for j in jobs()}
    assert (attempts[first.job_id], attempts[second.job_id]) == (1, 1), attempts


def _log(tmp_path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(tmp_path.glob("worker-*.log")))
