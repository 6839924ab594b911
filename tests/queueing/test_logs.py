"""Job log lines (queueing.logs): one per start, success, retry and failure, with job id,
task, key, tenant and duration; JSON with LOG_FORMAT=json.

The unit tests feed records shaped like procrastinate's worker records (its ``extra``
fields); the slow test reads a real worker's output.
"""

from __future__ import annotations

import json
import logging
import sys

import pytest
from procrastinate.contrib.django.models import ProcrastinateJob

from queueing.enqueue import Policy, enqueue
from queueing.keys import KeyFormat
from queueing.logs import (
    ROUTINE_QUEUE,
    ROUTINE_SUMMARY_SECONDS,
    JobEventFilter,
    JsonFormatter,
    PlainFormatter,
    register_key_format,
    takes_job_records,
    tenant_of,
)
from queueing.worker_state import WorkerStateHandler
from tests.conftest import wait_for
from tests.queueing import log_tasks  # noqa: F401  (registers the tasks for enqueue)


def record(
    action: str,
    *,
    level: int = logging.INFO,
    key: str | None = "exclusive/extract:acme:42",
    kwargs: dict | None = None,
    attempts: int = 0,
    exc: BaseException | None = None,
) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc else None
    rec = logging.LogRecord("procrastinate.worker", level, __file__, 1, "Job ended", (), exc_info)
    rec.action = action
    rec.worker = {"name": "w1", "worker_id": 3, "job_id": 42, "queues": []}
    rec.job = {
        "id": 42,
        "queue": "default",
        "task_name": "pipeline.extract",
        "task_kwargs": kwargs or {"anfrage_id": 42},
        "queueing_lock": key,
        "attempts": attempts,
    }
    rec.start_timestamp, rec.duration = 1000.0, 0.1234
    return rec


def passes(rec: logging.LogRecord, **kwargs) -> bool:
    return JobEventFilter(**kwargs).filter(rec)


def test_a_finished_job_is_one_plain_line_with_its_fields():
    rec = record("job_success")
    assert passes(rec)
    line = PlainFormatter().format(rec)
    assert "\n" not in line
    assert line.endswith(
        "procrastinate.worker: job succeeded id=42 task=pipeline.extract "
        "key=extract:acme:42 tenant=acme queue=default attempt=1 duration=0.123s"
    )


def test_a_started_job_has_no_duration_and_unknowns_are_dashes():
    rec = record("start_job", key=None, kwargs={"job_id": 7})
    assert passes(rec)
    line = PlainFormatter().format(rec)
    assert "job started id=42" in line
    assert "key=- tenant=-" in line
    assert "duration" not in line


def test_a_retry_is_one_line_naming_the_error_without_a_traceback():
    try:
        raise ValueError("core unreachable")
    except ValueError as exc:
        rec = record("job_error_retry", attempts=2, exc=exc)
    assert passes(rec)
    line = PlainFormatter().format(rec)
    assert "\n" not in line
    assert "job retrying" in line and "attempt=3" in line
    assert 'error="ValueError: core unreachable"' in line


def test_a_failure_keeps_its_traceback():
    try:
        raise ValueError("bad input")
    except ValueError as exc:
        rec = record("job_error", level=logging.ERROR, exc=exc)
    assert passes(rec)
    text = PlainFormatter().format(rec)
    assert text.splitlines()[0].split(": ", 1)[1].startswith("job failed id=42")
    assert "Traceback" in text


def test_json_lines_carry_the_same_fields():
    rec = record("job_success", kwargs={"tenant": "globex", "n": 1}, key=None)
    assert passes(rec)
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "job succeeded"
    assert out["level"] == "info"
    assert out | {"time": None} == out | {
        "time": None,
        "event": "succeeded",
        "id": 42,
        "task": "pipeline.extract",
        "key": None,
        "tenant": "globex",
        "attempt": 1,
        "duration": 0.1234,
    }


def test_json_for_an_ordinary_record_with_an_exception():
    try:
        raise RuntimeError("x")
    except RuntimeError:
        rec = logging.LogRecord(
            "runs", logging.ERROR, __file__, 1, "oops %s", ("!",), sys.exc_info()
        )
    out = json.loads(JsonFormatter().format(rec))
    assert out["message"] == "oops !"
    assert "RuntimeError: x" in out["exception"]


def test_procrastinates_other_info_chatter_is_dropped_but_warnings_and_lifecycle_kept():
    chatter = record("loaded_job_info")
    assert not passes(chatter)
    assert passes(record("start_worker"))
    assert passes(record("something", level=logging.WARNING))
    assert passes(chatter, level="INFO")


def test_job_log_level_warning_keeps_only_failures():
    assert not passes(record("job_success"), job_level="WARNING")
    assert passes(record("job_error", level=logging.ERROR), job_level="WARNING")


def test_tenant_comes_from_arguments_then_from_a_registered_key_format():
    assert tenant_of(key="extract:acme:1", task_kwargs={"tenant": "globex"}) == "globex"
    assert tenant_of(key="extract:acme:1", task_kwargs={}) == "acme"
    assert tenant_of(key="analysis:12", task_kwargs={}) is None
    with pytest.raises(ValueError, match="no 'tenant' part"):
        register_key_format(KeyFormat(prefix="analysis", parts=("job",)))


def job_events(worker) -> list[dict]:
    """The job lines (JSON) a real worker has logged so far."""
    lines = [line for line in worker.log().splitlines() if line.startswith("{")]
    return [e for e in map(json.loads, lines) if "event" in e]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_real_worker_logs_json_lines_per_job(clean_queue, start_worker):
    ok = enqueue("tests.logs.ok", args={"n": 1}, key="extract:acme:77", policy=Policy.EXCLUSIVE)
    failing = enqueue("tests.logs.always_fails")
    worker = start_worker(
        env={"LOG_FORMAT": "json", "PGSTAGE_TASK_MODULES": "tests.queueing.log_tasks"}
    )

    def events() -> list[dict]:
        return job_events(worker)

    wait_for(
        lambda: any(e["event"] == "failed" for e in events()),
        timeout=60,
        message="the failing job's last attempt",
    )
    by_job = {}
    for event in events():
        by_job.setdefault(event["id"], []).append(event["event"])
    assert by_job[ok.job_id] == ["started", "succeeded"]
    assert by_job[failing.job_id] == ["started", "retrying", "started", "failed"]
    success = next(e for e in events() if e["id"] == ok.job_id and e["event"] == "succeeded")
    assert success["key"] == "extract:acme:77"
    assert success["tenant"] == "acme"
    assert success["task"] == "tests.logs.ok"
    assert success["duration"] >= 0
    failure = next(e for e in events() if e["event"] == "failed")
    assert failure["error"] == "ValueError: the input is broken"
    assert "Traceback" in failure["exception"]


def access_record() -> logging.LogRecord:
    """A record as gunicorn's access logger makes it: the format string and its atoms."""
    atoms = {
        "h": "10.0.0.7",
        "m": "GET",
        "U": "/readyz",
        "q": "",
        "s": "503",
        "B": 139,
        "D": 4121,
        "a": "kube-probe/1.30",
        "f": "-",
        "r": "GET /readyz HTTP/1.1",
    }
    return logging.LogRecord(
        "gunicorn.access", logging.INFO, __file__, 1, '%(h)s "%(r)s" %(s)s', (atoms,), None
    )


def test_an_access_line_carries_the_request_as_fields_in_json():
    out = json.loads(JsonFormatter().format(access_record()))
    assert out["logger"] == "gunicorn.access"
    assert out["message"] == "GET /readyz 503"
    assert {k: out[k] for k in ("method", "path", "query", "status", "bytes", "duration")} == {
        "method": "GET",
        "path": "/readyz",
        "query": None,
        "status": 503,
        "bytes": 139,
        "duration": 0.004121,
    }
    assert out["remote"] == "10.0.0.7"
    assert out["user_agent"] == "kube-probe/1.30"
    assert out["referer"] is None


def test_an_access_line_carries_the_request_as_fields_in_plain_text():
    line = PlainFormatter().format(access_record())
    assert "INFO gunicorn.access: GET /readyz 503 " in line
    assert "status=503" in line and "duration=0.004s" in line and "bytes=139" in line
    assert "user_agent=kube-probe/1.30" in line
    assert "referer=" not in line and "query=" not in line


def test_other_records_with_a_mapping_are_left_alone():
    rec = logging.LogRecord("app", logging.INFO, __file__, 1, "%(a)s", ({"a": "x"},), None)
    assert json.loads(JsonFormatter().format(rec))["message"] == "x"
    assert PlainFormatter().format(rec).endswith("app: x")


def routine(action: str, *, level: int = logging.INFO, exc: BaseException | None = None):
    """A record of a sweep's tick or run (the sweeps' queue)."""
    rec = record(action, level=level, key="sweep:unsaved_runs", kwargs={}, exc=exc)
    rec.job["queue"] = ROUTINE_QUEUE
    rec.job["task_name"] = "sweeps.unsaved_runs.tick"
    return rec


def test_an_idle_workers_sweep_jobs_log_one_summary_per_period_at_info():
    """Two sweeps ticking every 30 s for an hour (each tick and each run a started and a
    succeeded line) log one summary line per five minutes, not 16 lines a minute."""
    jobs_filter = JobEventFilter()
    kept = []
    for minute in range(1, 61):
        # Two sweeps, twice a minute, a tick and a run each: a start and a success each.
        records = [routine(a) for _ in range(2 * 2 * 2) for a in ("start_job", "job_success")]
        for i, rec in enumerate(records):
            if minute % 5 == 0 and i == len(records) - 1:
                jobs_filter._routine_since -= ROUTINE_SUMMARY_SECONDS  # five minutes went by
            if jobs_filter.filter(rec):
                kept.append(rec)
    assert len(kept) == 12
    first = kept[0]
    assert first.getMessage() == (
        f"routine jobs (sweeps) in the last {ROUTINE_SUMMARY_SECONDS:.0f} s: "
        "40 started, 40 succeeded"
    )
    assert not hasattr(first, "job_event")
    assert "routine jobs (sweeps)" in PlainFormatter().format(first)


def test_a_sweep_jobs_failures_are_logged_and_other_jobs_are_not_summarised():
    assert passes(routine("job_error", level=logging.ERROR, exc=ValueError("x")))
    assert passes(routine("job_error_retry", level=logging.WARNING, exc=ValueError("x")))
    assert not passes(routine("job_success"))
    assert passes(record("job_success"))


def test_job_log_level_debug_keeps_every_sweep_jobs_line():
    assert passes(routine("start_job"), job_level="DEBUG")
    assert passes(routine("job_success"), job_level="DEBUG")


def test_the_routine_queue_is_the_sweeps_queue():
    from queueing.sweeps import SWEEP_QUEUE

    assert ROUTINE_QUEUE == SWEEP_QUEUE


# -- whether the worker builds a job's records (takes_job_records) ---------------------


@pytest.fixture
def job_logger(request):
    """A logger of its own, shaped as the project's procrastinate.worker logger: INFO, its
    own handlers, not propagating. Outside logging's tree of named loggers (pytest hangs
    its capturing handlers on those)."""
    log = logging.Logger(f"tests.job_records.{request.node.name}", logging.INFO)
    log.propagate = False
    return log


def jobs_handler(**filter_kwargs) -> logging.Handler:
    handler = logging.NullHandler()
    handler.addFilter(JobEventFilter(**filter_kwargs))
    return handler


def test_job_records_are_built_when_the_job_filter_keeps_their_level(job_logger):
    job_logger.addHandler(WorkerStateHandler())
    job_logger.addHandler(jobs_handler(job_level="INFO"))
    assert takes_job_records(job_logger, logging.INFO, "start_job")
    assert not takes_job_records(job_logger, logging.DEBUG, "start_job")  # the logger's own level


def test_with_job_lines_at_warning_only_failures_are_built(job_logger):
    job_logger.addHandler(WorkerStateHandler())
    job_logger.addHandler(jobs_handler(job_level="WARNING"))
    assert not takes_job_records(job_logger, logging.INFO, "start_job")
    assert takes_job_records(job_logger, logging.ERROR, "job_error")


def test_the_worker_state_handler_takes_no_job_records(job_logger):
    job_logger.addHandler(WorkerStateHandler())
    assert not takes_job_records(job_logger, logging.INFO, "start_job")
    assert not takes_job_records(job_logger, logging.ERROR, "job_error")


def test_a_handler_without_the_job_filter_gets_every_record_its_level_allows(job_logger):
    plain = logging.NullHandler(level=logging.WARNING)
    job_logger.addHandler(plain)
    assert not takes_job_records(job_logger, logging.INFO, "start_job")
    plain.setLevel(logging.INFO)
    assert takes_job_records(job_logger, logging.INFO, "start_job")
    plain.addFilter(lambda record: False)  # a filter it cannot reason about: kept
    assert takes_job_records(job_logger, logging.INFO, "start_job")


def test_a_job_filter_on_the_logger_itself_counts(job_logger):
    job_logger.addHandler(logging.NullHandler())
    job_logger.addFilter(JobEventFilter(job_level="WARNING"))
    assert not takes_job_records(job_logger, logging.INFO, "start_job")


def test_records_propagate_to_the_parents_handlers(job_logger):
    child = logging.Logger(f"{job_logger.name}.worker-1")  # a named worker's logger
    child.parent = job_logger
    assert not takes_job_records(child, logging.INFO, "start_job")
    job_logger.addHandler(jobs_handler(job_level="INFO"))
    assert takes_job_records(child, logging.INFO, "start_job")
    job_logger.removeHandler(job_logger.handlers[0])
    child.propagate = False
    job_logger.addHandler(jobs_handler(job_level="INFO"))
    assert not takes_job_records(child, logging.INFO, "start_job")


def test_with_no_handler_anywhere_only_what_the_last_resort_prints(job_logger):
    assert not takes_job_records(job_logger, logging.INFO, "start_job")
    assert takes_job_records(job_logger, logging.ERROR, "job_error")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_with_job_lines_off_a_real_worker_logs_its_failures_with_every_field(
    clean_queue, start_worker
):
    """JOB_LOG_LEVEL=WARNING: the worker builds no record of a job's start or success,
    and a failure's line still names the job, its key, its tenant and its error."""
    ok = enqueue("tests.logs.ok", args={"n": 1}, key="extract:acme:78", policy=Policy.EXCLUSIVE)
    failing = enqueue("tests.logs.always_fails", key="extract:acme:79", policy=Policy.EXCLUSIVE)
    worker = start_worker(
        env={
            "LOG_FORMAT": "json",
            "JOB_LOG_LEVEL": "WARNING",
            "PGSTAGE_TASK_MODULES": "tests.queueing.log_tasks",
        }
    )

    def events() -> list[dict]:
        return job_events(worker)

    wait_for(
        lambda: any(e["event"] == "failed" for e in events()),
        timeout=60,
        message="the failing job's last attempt",
    )
    wait_for(
        lambda: ProcrastinateJob.objects.get(id=ok.job_id).status == "succeeded",
        timeout=30,
        message="the good job's success",
    )
    assert [(e["id"], e["event"]) for e in events()] == [(failing.job_id, "failed")]
    failure = events()[0]
    assert failure["key"] == "extract:acme:79"
    assert failure["tenant"] == "acme"
    assert failure["error"] == "ValueError: the input is broken"


def test_procrastinates_debug_job_steps_follow_the_filters_level_not_the_job_level(job_logger):
    job_logger.setLevel(logging.DEBUG)
    job_logger.addHandler(jobs_handler(level="DEBUG", job_level="WARNING"))
    assert takes_job_records(job_logger, logging.DEBUG, "loaded_job_info")
    assert not takes_job_records(job_logger, logging.INFO, "start_job")


# -- the worker's side: fields built only for a handler that keeps them ----------------


@pytest.fixture
def quiet_worker(job_logger, monkeypatch):
    """A named PgstageWorker's logging methods: its job steps on a child of
    ``job_logger``, its outcomes on ``job_logger`` (procrastinate's module logger, where
    procrastinate logs them), with a count of the jobs turned into dicts."""
    from procrastinate import jobs
    from procrastinate import worker as procrastinate_worker

    from queueing.worker import PgstageWorker

    built = []
    log_context = jobs.Job.log_context
    monkeypatch.setattr(
        jobs.Job, "log_context", lambda job: built.append(job.id) or log_context(job)
    )
    monkeypatch.setattr(procrastinate_worker, "logger", job_logger)
    worker = object.__new__(PgstageWorker)  # its logging needs none of its start-up
    # A named worker logs its job steps on a child of procrastinate's logger.
    worker.logger = logging.Logger(f"{job_logger.name}.w1")
    worker.logger.parent = job_logger
    worker.worker_name, worker.worker_id, worker.queues = "w1", 3, None
    worker._errors = {}
    return worker, built


def job_context(job_id: int = 42):
    from procrastinate import job_context as procrastinate_job_context
    from procrastinate import jobs

    job = jobs.Job(
        id=job_id,
        queue="default",
        lock=None,
        queueing_lock="exclusive/extract:acme:42",
        task_name="pipeline.extract",
        task_kwargs={"anfrage_id": job_id},
        attempts=0,
    )
    return procrastinate_job_context.JobContext(
        app=None, job=job, abort_reason=lambda: None, start_timestamp=1000.0
    )


@pytest.mark.parametrize(("job_level", "builds"), [("WARNING", False), ("INFO", True)])
def test_the_worker_builds_a_jobs_start_and_success_only_for_a_handler_that_keeps_them(
    quiet_worker, job_logger, job_level, builds
):
    from procrastinate import jobs

    worker, built = quiet_worker
    job_logger.addHandler(WorkerStateHandler())
    job_logger.addHandler(jobs_handler(job_level=job_level))
    context = job_context()
    extra = worker._log_extra(action="start_job", context=context, job_result=None)
    worker._log_job_outcome(jobs.Status.SUCCEEDED, context, None, None)
    assert ("job" in extra) is builds
    assert built == ([42, 42] if builds else [])


def test_with_job_lines_off_a_failure_is_built_and_its_error_kept_for_the_give_up(
    quiet_worker, job_logger
):
    from procrastinate import jobs

    worker, built = quiet_worker
    job_logger.addHandler(jobs_handler(job_level="WARNING"))
    error = ValueError("the input is broken")
    worker._log_job_outcome(jobs.Status.FAILED, job_context(), None, None, exc_info=error)
    assert built == [42]
    assert worker._errors == {42: error}


def test_a_named_workers_outcome_is_judged_on_the_logger_procrastinate_logs_it_on(
    quiet_worker, job_logger
):
    """procrastinate logs a job's outcome on its module's logger, not the named worker's
    child: a child quieter than its parent silences the steps, never the outcome."""
    from procrastinate import jobs

    worker, built = quiet_worker
    worker.logger.setLevel(logging.WARNING)
    job_logger.addHandler(jobs_handler(job_level="INFO"))
    worker._log_job_outcome(jobs.Status.SUCCEEDED, job_context(), None, None)
    assert built == [42]
