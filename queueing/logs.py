"""Logs in one format for every process: Django, the worker and gunicorn — plain
``key=value`` text, or one JSON object per line with ``LOG_FORMAT=json``.

Job logs: one line per job start, success, retry, failure and abort, with the job's id,
task, singleton key, tenant, attempt and duration; the sweeps' own jobs, routine, in one
summary line per five minutes at most (what an idle worker logs). Access logs:
gunicorn's access record becomes one line with the request as fields (method, path,
query, status, bytes, duration in seconds, remote address, user agent, referer) instead
of one preformatted string; :mod:`queueing.gunicorn` wires both formatters into gunicorn.

The lines are procrastinate's own worker log records (``procrastinate.worker``), which
carry the job and its timing as ``extra`` fields: :class:`JobEventFilter` keeps those (and
the worker's start and stop), drops procrastinate's other chatter below the configured
level, and attaches a :class:`JobEvent`; the formatters render it. No worker code changes;
a project wires them in ``LOGGING`` (docs/getting-started.md). ``JOB_LOG_LEVEL=WARNING``
keeps only failures.

The key is the job's ``queueing_lock`` without the policy's prefix. The tenant comes from
a ``tenant`` task argument, or from the key when its format has a ``tenant`` part: a
domain declares its formats with :func:`register_key_format` (a key format
``stage:tenant:item`` does); jobs that name neither log ``tenant=-``.
"""

from __future__ import annotations

import collections
import datetime
import json
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from queueing.enqueue import EXCLUSIVE_PREFIX
from queueing.exceptions import InvalidKey
from queueing.keys import KeyFormat

__all__ = ["JobEventFilter", "JsonFormatter", "PlainFormatter", "register_key_format"]

#: procrastinate's ``action`` of a record → the event pgstage logs.
JOB_ACTIONS = {
    "start_job": "started",
    "job_success": "succeeded",
    "job_error_retry": "retrying",
    "job_error": "failed",
    "job_aborted": "aborted",
    "job_aborted_retry": "aborted_retrying",
}
#: The queue of the sweeps' ticks and runs (``queueing.sweeps.SWEEP_QUEUE``): routine jobs.
ROUTINE_QUEUE = "sweeps"
#: At most one summary line of routine jobs per this many seconds.
ROUTINE_SUMMARY_SECONDS = 300.0
#: The worker's own lifecycle, kept at any level: a handful of lines per deploy.
WORKER_ACTIONS = frozenset({"start_worker", "stopping_worker", "stop_worker"})
TENANT_ARGUMENTS = ("tenant", "tenant_slug", "tenant_id")
#: Fields of a plain line, in order.
PLAIN_FIELDS = ("id", "task", "key", "tenant", "queue", "attempt", "duration", "error")
#: gunicorn's access logger; its records carry the request's atoms as their args.
ACCESS_LOGGER = "gunicorn.access"

_key_formats: list[KeyFormat] = []


def register_key_format(key_format: KeyFormat) -> None:
    """Let job lines name the tenant of keys built by ``key_format`` (it needs a ``tenant``
    part). Idempotent."""
    if "tenant" not in key_format.parts:
        raise ValueError(f"key format {key_format.parts} has no 'tenant' part")
    if key_format not in _key_formats:
        _key_formats.append(key_format)


def key_of(queueing_lock: str | None) -> str | None:
    if not queueing_lock:
        return None
    return queueing_lock.removeprefix(EXCLUSIVE_PREFIX)


def tenant_of(*, key: str | None, task_kwargs: Mapping[str, Any]) -> str | None:
    for name in TENANT_ARGUMENTS:
        if task_kwargs.get(name) not in (None, ""):
            return str(task_kwargs[name])
    if key is None:
        return None
    for key_format in _key_formats:
        try:
            return key_format.parse(key)["tenant"]
        except InvalidKey:
            continue
    return None


@dataclass(frozen=True, kw_only=True)
class JobEvent:
    event: str
    id: int | None
    task: str | None
    key: str | None
    tenant: str | None
    queue: str | None
    attempt: int | None
    duration: float | None
    worker: str | None
    error: str | None

    def values(self) -> dict[str, Any]:
        """The fields by name, as the formatters render them (``dataclasses.asdict``
        copies each value deeply: a fifth of what a worker spent logging its job lines)."""
        return {name: getattr(self, name) for name in _JOB_EVENT_FIELDS}

    @classmethod
    def from_record(cls, record: logging.LogRecord, event: str) -> JobEvent:
        job = getattr(record, "job", None) or {}
        worker = getattr(record, "worker", None) or {}
        key = key_of(job.get("queueing_lock"))
        attempts = job.get("attempts")
        duration = getattr(record, "duration", None) if event != "started" else None
        error = None
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            error = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
        return cls(
            event=event,
            id=job.get("id"),
            task=job.get("task_name"),
            key=key,
            tenant=tenant_of(key=key, task_kwargs=job.get("task_kwargs") or {}),
            queue=job.get("queue"),
            # procrastinate counts attempts already made; the running one is the next.
            attempt=attempts + 1 if isinstance(attempts, int) else None,
            duration=round(duration, 6) if isinstance(duration, int | float) else None,
            worker=worker.get("name"),
            error=error,
        )


_JOB_EVENT_FIELDS = tuple(f.name for f in fields(JobEvent))


def _int_or_none(value: object) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def _text_or_none(value: object) -> str | None:
    return None if value in (None, "", "-") else str(value)


def access_fields(record: logging.LogRecord) -> dict[str, Any] | None:
    """The request of a gunicorn access record as fields (None for any other record).
    gunicorn hands the record its atoms: ``m`` method, ``U`` path, ``q`` query, ``s``
    status, ``B`` bytes, ``D`` duration in microseconds, ``h`` remote address, ``a`` user
    agent, ``f`` referer."""
    if record.name != ACCESS_LOGGER or not isinstance(record.args, Mapping):
        return None
    atoms = record.args
    micros = _int_or_none(atoms.get("D"))
    return {
        "method": _text_or_none(atoms.get("m")),
        "path": _text_or_none(atoms.get("U")),
        "query": _text_or_none(atoms.get("q")),
        "status": _int_or_none(atoms.get("s")),
        "bytes": _int_or_none(atoms.get("B")),
        "duration": micros / 1e6 if micros is not None else None,
        "remote": _text_or_none(atoms.get("h")),
        "user_agent": _text_or_none(atoms.get("a")),
        "referer": _text_or_none(atoms.get("f")),
    }


def _access_message(fields: Mapping[str, Any]) -> str:
    return f"{fields['method']} {fields['path']} {fields['status']}"


def _level(value: str | int) -> int:
    return logging.getLevelName(value.upper()) if isinstance(value, str) else value


class JobEventFilter(logging.Filter):
    """Keeps job events at ``job_level`` or above (attaching ``record.job_event``), the
    worker's start and stop, and other records at ``level`` or above.

    The sweeps' own jobs (their ticks and runs, on ``routine_queues``) are routine: an idle
    worker would log dozens of lines a minute of them. Their successes and starts count
    as ``DEBUG``; every ``summary_seconds`` at most, one of them is kept as a one-line
    summary of how many ran since the last. Their retries and failures are kept as any
    job's."""

    def __init__(
        self,
        level: str | int = logging.WARNING,
        job_level: str | int = logging.INFO,
        routine_queues: Iterable[str] = (ROUTINE_QUEUE,),
        summary_seconds: float = ROUTINE_SUMMARY_SECONDS,
    ):
        super().__init__()
        self.level = _level(level)
        self.job_level = _level(job_level)
        self.routine_queues = frozenset(routine_queues)
        self.summary_seconds = summary_seconds
        self._routine: collections.Counter[str] = collections.Counter()
        self._routine_since = time.monotonic()
        self._lock = threading.Lock()

    def keeps(self, action: str, levelno: int) -> bool:
        """Whether a record of ``action`` at ``levelno`` can pass (a routine job's line
        passes only as a summary, at ``job_level`` too)."""
        if action in JOB_ACTIONS:
            return levelno >= self.job_level
        return action in WORKER_ACTIONS or levelno >= self.level

    def filter(self, record: logging.LogRecord) -> bool:
        action = getattr(record, "action", "")
        event = JOB_ACTIONS.get(action)
        if event is None:
            return self.keeps(action, record.levelno)
        if self._is_routine(record):
            return self._summarise(record, event)
        if record.levelno < self.job_level:
            return False
        record.job_event = JobEvent.from_record(record, event)
        record.msg, record.args = f"job {event}", ()
        if event in ("retrying", "aborted_retrying"):
            # The next attempt follows: one line with the error, not a traceback each time.
            record.exc_info, record.exc_text = None, None
        return True

    def _is_routine(self, record: logging.LogRecord) -> bool:
        job = getattr(record, "job", None) or {}
        return (
            record.levelno < logging.WARNING
            and self.job_level > logging.DEBUG
            and job.get("queue") in self.routine_queues
        )

    def _summarise(self, record: logging.LogRecord, event: str) -> bool:
        """Count a routine job event; turn it into the summary line when one is due."""
        with self._lock:
            self._routine[event] += 1
            seconds = time.monotonic() - self._routine_since
            if seconds < self.summary_seconds:
                return False
            counts = ", ".join(f"{n} {name}" for name, n in sorted(self._routine.items()))
            self._routine.clear()
            self._routine_since = time.monotonic()
        record.msg = "routine jobs (sweeps) in the last %d s: %s"
        record.args = (round(seconds), counts)
        record.exc_info, record.exc_text = None, None
        return record.levelno >= self.job_level


def takes_job_records(logger: logging.Logger, levelno: int, action: str) -> bool:
    """Whether procrastinate's worker record of a job's step ``action`` at ``levelno``,
    logged on ``logger``, reaches a handler that keeps it. The worker builds such a
    record's fields (the job as a dict, the worker's) only then.

    A handler keeps one unless its level is over ``levelno``, a :class:`JobEventFilter`
    of its (or of the logger's) drops it (:meth:`JobEventFilter.keeps`), or it declares
    that it takes none (``job_records = False``, as
    :class:`~queueing.worker_state.WorkerStateHandler`). A filter it does not know counts
    as keeping them, so a project's own handler gets every record. What is no handler
    (a hook on ``Logger.callHandlers``, as Sentry's logging integration) is not asked."""
    if not logger.isEnabledFor(levelno):
        return False
    if not all(_keeps(f, action, levelno) for f in logger.filters):
        return False
    handlers = 0
    current: logging.Logger | None = logger
    while current is not None:
        for handler in current.handlers:
            handlers += 1
            if levelno < handler.level or not getattr(handler, "job_records", True):
                continue
            if all(_keeps(f, action, levelno) for f in handler.filters):
                return True
        if not current.propagate:
            break
        current = current.parent
    last_resort = logging.lastResort
    return handlers == 0 and last_resort is not None and levelno >= last_resort.level


def _keeps(log_filter: Any, action: str, levelno: int) -> bool:
    return not isinstance(log_filter, JobEventFilter) or log_filter.keeps(action, levelno)


def _plain_value(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3f}s"
    text = str(value)
    if not text or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text)
    return text


class PlainFormatter(logging.Formatter):
    """``2025-01-31 12:00:00,000 INFO procrastinate.worker: job succeeded id=7 task=…``"""

    def __init__(self, fmt: str | None = None, **kwargs: Any):
        super().__init__(fmt or "%(asctime)s %(levelname)s %(name)s: %(message)s", **kwargs)

    def format(self, record: logging.LogRecord) -> str:
        access = access_fields(record)
        if access is None:
            return super().format(record)
        record.message = _access_message(access)
        record.asctime = self.formatTime(record, self.datefmt)
        line = self._style.format(record)
        fields = [f"{name}={_plain_value(value)}" for name, value in access.items() if value]
        return f"{line} {' '.join(fields)}"

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        event = getattr(record, "job_event", None)
        if event is None:
            return line
        values = event.values()
        fields = [
            f"{name}={_plain_value(values[name]) if values[name] is not None else '-'}"
            for name in PLAIN_FIELDS
            if values[name] is not None or name in ("key", "tenant")
        ]
        return f"{line} {' '.join(fields)}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ISO 8601), ``level``, ``logger``,
    ``message``, the job event's or the request's fields when there are any, and
    ``exception``."""

    def format(self, record: logging.LogRecord) -> str:
        access = access_fields(record)
        out: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": _access_message(access) if access else record.getMessage(),
        }
        event = getattr(record, "job_event", None)
        if event is not None:
            out.update(event.values())
        if access is not None:
            out.update(access)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, default=str)
