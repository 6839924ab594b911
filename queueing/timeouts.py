"""Job timeouts: how long one run of a task may take before it counts as hung.

A task declares ``@task(timeout=S)`` (seconds; ``0`` for no bound), or gets
``QUEUEING_JOB_TIMEOUT_SECONDS`` (3600 s by default; ``0`` or ``None``: no bound). The
worker's fetch records each run's deadline on the database's clock, in the same
statement (``pgstage_job_deadlines``, per job and attempt, with the fetching worker's
id), so that every process that runs stalled recovery judges it alike, whichever release
or worker fetched the job. A row judges only its own worker's run: one left by a dead run
that a worker of the release before job timeouts put back (and fetched again at the same
attempt, recording none) ends nothing (migration 0012); one a worker of the previous release
fetched last, rewriting its deadlines but not whose run it is, is judged as that release
judged it (migration 0013).

Past its deadline:

* an **async** run is cancelled by its worker (the task sees the cancellation): it fails
  as an attempt with :class:`~queueing.exceptions.JobTimedOut`, and its retry strategy
  decides;
* a **sync** run cannot be stopped (Python cannot kill a thread). Once its deadline is
  ``QUEUEING_JOB_TIMEOUT_GRACE_SECONDS`` old (never less than recovery's resume gap and
  twice the liveness bound: 16 s with the defaults, :func:`least_grace_seconds`), stalled
  recovery ends the run as a failed attempt (:class:`~queueing.exceptions.JobTimedOut`):
  the task's retry strategy decides retry or failed, and a job failed for good records
  its owed give-up hook in the same statement (``queueing.stalled``). The hung thread's
  outcome, whenever it comes, is refused: the worker's fenced statements match the
  attempt they ran, which is over.
* A job that keeps raising ``PollLater`` polls without spending attempts until its
  first run's deadline (``deadline``, kept by its polls); past it each poll counts as an
  attempt, so its retry strategy ends it. Each run is judged hung by its own deadline
  (``run_deadline``, set by every fetch) when that is later: a run fetched again after
  its polls' deadline has its whole timeout.

A hung sync run still holds its worker's slot. Each heartbeat counts them; a worker whose
slots are all held by hung runs says so in its log (once per change), in ``/metrics``
(``pgstage_worker_hung_slots``, ``pgstage_workers_all_slots_hung``) and in
``manage.py worker_health`` (exit 1), so its supervisor restarts it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from django.conf import settings

#: Per task name: its declared timeout (seconds, 0 = no bound); absent: the default.
_declared: dict[str, float] = {}


def check_seconds(value: Any, *, allow_zero: bool = True) -> float | None:
    """``value`` as seconds (None when it is not a finite number, is negative, or is
    0 where 0 is not allowed); ``None`` and ``0`` where allowed mean 0 (no bound)."""
    if value is None and allow_zero:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        return None
    return seconds


def default_seconds() -> float:
    """``QUEUEING_JOB_TIMEOUT_SECONDS`` (0: no bound); a nonsensical value is refused by
    system check ``queueing.E004`` and read as the framework's default here."""
    seconds = check_seconds(getattr(settings, "QUEUEING_JOB_TIMEOUT_SECONDS", 3600))
    return 3600.0 if seconds is None else seconds


def grace_seconds() -> float:
    """How long past its deadline a run is left to save its own outcome before stalled
    recovery ends it: ``QUEUEING_JOB_TIMEOUT_GRACE_SECONDS``, and never less than
    :func:`least_grace_seconds`."""
    seconds = check_seconds(
        getattr(settings, "QUEUEING_JOB_TIMEOUT_GRACE_SECONDS", 30), allow_zero=False
    )
    return max(30.0 if seconds is None else seconds, least_grace_seconds())


def least_grace_seconds() -> float:
    """The shortest grace that lets a run which ended at its deadline, as the database
    went away, save its outcome once it is back: an outage no longer than stalled
    recovery's resume gap does not move recovery's clock (the deadline then counts as it
    is, ``timed_out_jobs``), and after it the worker's heartbeat lands within the liveness
    bound, and its save within one more."""
    from queueing.outage import beat_resume_seconds
    from queueing.sweeps import resume_gap_seconds

    heartbeat = float(getattr(settings, "QUEUEING_HEARTBEAT_SECONDS", 10))
    gap = resume_gap_seconds(
        grace=float(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30)), heartbeat=heartbeat
    )
    return max(0.0, gap) + 2 * beat_resume_seconds(heartbeat)


def declare(task_name: str, timeout: Any) -> None:
    """Record ``@task(timeout=...)``; ``None`` keeps the default. Raises ValueError on a
    value that is no finite number of seconds at least 0."""
    if timeout is None:
        _declared.pop(task_name, None)
        return
    seconds = check_seconds(timeout)
    if seconds is None:
        raise ValueError(
            f"task {task_name!r}: timeout={timeout!r} must be a finite number of seconds, "
            "0 for no bound"
        )
    _declared[task_name] = seconds


def declared() -> Mapping[str, float]:
    """The timeouts declared per task name (system check ``queueing.E004`` reads them)."""
    return dict(_declared)


def timeout_seconds(task_name: str, *, default: float | None = None) -> float:
    """The bound of one run of the task (0: none); ``default``: :func:`default_seconds`,
    when the caller has read it already."""
    if task_name in _declared:
        return _declared[task_name]
    return default_seconds() if default is None else default


def for_tasks(tasks: Mapping[str, Any]) -> tuple[list[str], list[float]]:
    """The names (aliases included) and bounds of ``tasks`` (procrastinate's name → task
    mapping) that have a bound, as the fetch statement takes them."""
    names, seconds = [], []
    default = default_seconds()  # read once per call: the worker calls this per fetch
    for name, task in sorted(tasks.items()):
        bound = timeout_seconds(getattr(task, "name", name), default=default)
        if bound > 0:
            names.append(name)
            seconds.append(bound)
    return names, seconds
