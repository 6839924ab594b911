"""The forensics of a run that did not end quiet: the workers' stacks on demand, and the
report that names each unfinished job's log lines and its holder's stacks."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import ROOT
from tests.nemesis import forensics

WORKER = """
import asyncio, sys, threading, time
from tests.nemesis.forensics import install_dumps
install_dumps()

def hung_job():
    print("ready", flush=True)  # from the job's thread: it hangs from here on
    time.sleep(60)

async def run_job():
    await asyncio.to_thread(hung_job)

async def main():
    loop = asyncio.get_running_loop()
    job = loop.create_task(run_job(), name="process job runs.process_job[144]")
    await job

asyncio.run(main())
"""


def test_a_worker_dumps_its_threads_and_its_tasks_on_demand(tmp_path):
    log = tmp_path / "worker-0.1.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-c", WORKER], cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 20
        while "ready" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(forensics.THREADS_SIGNAL)
        # The tasks' dump only once the threads' dump is written: both at once can crash
        # the worker (faulthandler walks the frames the tasks' dump is using).
        deadline = time.monotonic() + 20
        while "in hung_job" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        process.send_signal(forensics.TASKS_SIGNAL)
        deadline = time.monotonic() + 20
        while forensics.TASKS_MARK not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert process.poll() is None, "a dump must not end the worker"
    finally:
        process.kill()
        process.wait()
    text = log.read_text()
    assert "Thread 0x" in text
    assert "in hung_job" in text  # the job's thread, where it hangs
    assert "--- process job runs.process_job[144]" in text
    assert "in run_job" in text  # the job's task, awaiting its thread


def test_the_report_names_each_unfinished_jobs_lines_and_its_holders_stacks(tmp_path):
    holder, other = tmp_path / "worker-0.1.log", tmp_path / "worker-1.1.log"
    holder.write_text(
        "03:00:01 INFO procrastinate.worker.nemesis-0: job started id=144 task=runs.process_job\n"
        "03:00:01 INFO procrastinate.worker.nemesis-0: job started id=1440 task=runs.process_job\n"
        'Thread 0x00007f (most recent call first):\n  File "/x/runs/processing.py", line 9 in '
        'analysis_job_process\n  File "/usr/local/lib/python3.11/threading.py", line 1 in run\n'
        f"{forensics.TASKS_MARK} 77 ===\n--- process job runs.process_job[144]\n"
        "Stack for <Task pending name='process job' coro=<x() at "
        "/usr/local/lib/python3.11/asyncio/tasks.py:1>> (most recent call last):\n"
        '  File "/x/queueing/worker.py", line 700, in _runs_again_after\n'
        "    await asyncio.wait([first])\n"
        '  File "/usr/local/lib/python3.11/asyncio/tasks.py", line 428, in wait\n'
        "    return await _wait(fs, timeout, return_when, loop)\n"
    )
    other.write_text("03:00:00 WARNING queueing.worker: job 144 was fetched again\n")
    history = [
        {"type": "worker", "event": "start", "log": str(holder)},
        {"type": "worker", "event": "start", "log": str(other)},
        {
            "type": "unfinished_detail",
            "workers": [[3, 0.4]],
            "jobs": [
                [
                    144,
                    "runs.process_job",
                    "doing",
                    0,
                    3,
                    "analysis:9",
                    "2026-12-04",
                    0.4,
                    [["deferred", "2026-12-04 03:00:00.100000"]],
                ],
            ],
        },
    ]
    text = forensics.report(history)
    assert "job 144 runs.process_job doing attempts=0 lock=analysis:9 worker=3" in text
    assert "events: deferred@03:00:00.100" in text
    assert (
        "worker-0.1.log: 03:00:01 INFO procrastinate.worker.nemesis-0: job started id=144 " in text
    )
    assert "id=1440" not in text
    assert "worker-1.1.log: 03:00:00 WARNING queueing.worker: job 144 was fetched again" in text
    assert "stacks of worker-0.1.log" in text
    assert "in analysis_job_process" in text
    assert "threading.py" not in text  # the standard library's plumbing is left out
    assert "--- process job runs.process_job[144]" in text
    assert "in _runs_again_after\n" in text and "await asyncio.wait([first])" in text
    assert "asyncio/tasks.py" not in text and "return await _wait" not in text


def test_a_quiet_run_has_no_report():
    assert forensics.report([{"type": "quiet", "seconds": 3.0}]) == ""
