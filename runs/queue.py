"""The per-user analysis queue and the keys of the jobs it enqueues, declared once.

Admission and every promoter (``process_job``'s tail call, the resume tick) go through
:data:`ANALYSIS_QUEUE`, so they share one lock namespace and one key format: a second
spelling (``analysis-queue``) would split the lock in two and serialise nothing.
"""

from __future__ import annotations

from queueing import locks
from queueing.keys import KeyFormat
from queueing.serial import SerialQueue
from runs.models import ACTIVE_STATUSES, AnalysisJob, JobStatus

#: Task names and queue of the analyses' jobs (enqueued by name from services, so a
#: job in the table survives a module move).
PROCESS_JOB_TASK = "runs.process_job"
JUDGE_RUN_TASK = "runs.judge_run"
RUNS_QUEUE = "analyses"

ANALYSIS_QUEUE_LOCK = locks.namespace("analysis_queue")

ANALYSIS_QUEUE = SerialQueue(
    model=AnalysisJob,
    namespace=ANALYSIS_QUEUE_LOCK,
    key_field="user",
    status_field="status",
    created_field="created_at",
    updated_field="updated_at",
    parent_field="delta_of_job",
    deleted_field="deleted_at",
    queued=JobStatus.QUEUED.value,
    start=JobStatus.PENDING.value,
    active=tuple(s.value for s in ACTIVE_STATUSES),
)

#: ``analysis:<job id>``: at most one process_job per analysis job waiting or running.
PROCESS_JOB_KEY = KeyFormat(prefix="analysis", parts=("job",))
#: ``run_judge:<run id>:<version>``: one judge job per recorded run version.
JUDGE_RUN_KEY = KeyFormat(prefix="run_judge", parts=("run", "version"))
