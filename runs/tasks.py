"""The analyses' procrastinate tasks (thin: ids in, one service call) and sweeps."""

from __future__ import annotations

import uuid

from queueing.app import task
from runs import durability, processing
from runs import sweeps as _sweeps  # noqa: F401  (declares the analyses' sweeps)
from runs.queue import JUDGE_RUN_TASK, PROCESS_JOB_TASK, RUNS_QUEUE


@task(name=PROCESS_JOB_TASK, queue=RUNS_QUEUE, on_give_up=processing.analysis_job_abandon)
def process_job(job_id: int, tenant: str = "") -> str:
    """Release, judge and finish one analysis job (see analysis_job_process). ``tenant``
    names the job's tenant in its log lines (jobs enqueued before it existed lack it)."""
    return processing.analysis_job_process(job_id=job_id).value


@task(name=JUDGE_RUN_TASK, queue=RUNS_QUEUE)
def judge_run(run_id: str, version: int, tenant: str = "") -> str:
    """Judge one recorded run version, once (``tenant``: for the log lines only)."""
    return durability.analysis_run_judge(run_id=uuid.UUID(run_id), version=version)
