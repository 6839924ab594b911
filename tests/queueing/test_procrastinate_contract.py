"""The contract with procrastinate: every private name pgstage overrides, calls or reads,
in one place, so that an upgrade of procrastinate fails here, loudly, instead of silently
skipping an override (a renamed ``Worker`` method would simply never be called again).

pgstage supports procrastinate ``>=3.10,<3.11`` (pyproject.toml; docs/api.md). To move the
range, upgrade, run this module, and adapt ``queueing/worker.py`` to what changed.

What is pinned:

* the ``Worker`` methods pgstage's worker overrides or calls: present, coroutine or not as
  pgstage awaits them, with the parameters pgstage passes;
* every override in ``PgstageWorker`` has its base method's parameters (one check over the
  whole class, so a new override is covered without editing this module);
* the worker's private attributes pgstage reads or sets, and the ``App`` attributes
  ``install()`` and the worker rely on;
* the public-but-structural names: ``JobManager.fetch_job`` / ``register_worker``,
  ``PeriodicDeferrer.defer_jobs``, ``Job.from_row``, ``get_channel_for_queues``,
  ``connector_params``, and psycopg_pool's ``timeout``, ``reconnect_timeout`` and
  ``check()``;
* procrastinate's SQL functions pgstage's statements call, with their argument types, in
  the migrated database (``procrastinate_fetch_job_v2``'s body is pinned separately, in
  ``tests/queueing/test_fetch.py``, and the defer's in ``test_enqueue.py``).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from django.db import connection
from packaging.specifiers import SpecifierSet
from procrastinate import App, jobs, manager, periodic
from procrastinate import worker as procrastinate_worker
from procrastinate.contrib.django import utils as django_utils
from procrastinate.contrib.django.django_connector import DjangoConnector
from procrastinate.psycopg_connector import PsycopgConnector
from procrastinate.testing import InMemoryConnector
from psycopg_pool import AsyncConnectionPool

from queueing.worker import PgstageWorker

SUPPORTED = SpecifierSet(">=3.10,<3.11")

#: name -> (is a coroutine function, its parameters after ``self``)
WORKER_METHODS: dict[str, tuple[bool, tuple[str, ...]]] = {
    # overridden
    "_fetch_and_process_jobs": (True, ()),
    "_process_job": (True, ("context",)),
    "_update_heartbeat": (True, ()),
    "_periodic_deferrer": (True, ()),
    "_start_side_tasks": (False, ()),
    "_monitor_side_tasks": (True, ("side_tasks",)),
    "_log_job_outcome": (False, ("status", "context", "job_result", "job_retry", "exc_info")),
    "_persist_job_status": (
        True,
        ("job", "status", "retry_decision", "context", "job_result"),
    ),
    "_shutdown": (True, ("side_tasks",)),
    # called
    "_poll_jobs_to_abort": (True, ()),
    "_handle_notification": (True, ("channel", "notification")),
    "_abort_running_jobs": (True, ()),
    "_log_extra": (False, ("action", "context", "job_result", "kwargs")),
    "_run_loop": (True, ()),
    "run": (True, ()),
    "stop": (False, ()),
}
#: Set in ``Worker.__init__`` and read or set by pgstage's worker.
WORKER_ATTRIBUTES = (
    "_stop_event",
    "_new_job_event",
    "_running_jobs",
    "_job_ids_to_abort",
    "_loop",
    "run_task",
    "worker_id",
    "update_heartbeat_interval",
    "shutdown_graceful_timeout",
    "listen_notify",
    "delete_jobs",
    "queues",
    "logger",
)
APP_ATTRIBUTES = (
    "_worker",
    "job_manager",
    "connector",
    "tasks",
    "periodic_registry",
    "periodic_defaults",
    "worker_defaults",
)
#: procrastinate's SQL functions that pgstage's own statements call, as ``regprocedure``.
SQL_FUNCTIONS = (
    "procrastinate_defer_jobs_v1(procrastinate_job_to_defer_v1[])",
    "procrastinate_fetch_job_v2(character varying[],bigint)",
    "procrastinate_finish_job_v1(bigint,procrastinate_job_status,boolean)",
    "procrastinate_register_worker_v1()",
    "procrastinate_retry_job_v2(bigint,timestamp with time zone,integer,character varying,"
    "character varying)",
)


def parameters(func) -> tuple[str, ...]:
    return tuple(name for name in inspect.signature(func).parameters if name != "self")


def test_the_installed_procrastinate_is_a_supported_one():
    assert version("procrastinate") in SUPPORTED


@pytest.mark.parametrize("name", sorted(WORKER_METHODS))
def test_each_worker_method_pgstage_relies_on_is_there_as_it_expects(name):
    is_coroutine, expected = WORKER_METHODS[name]
    method = getattr(procrastinate_worker.Worker, name, None)

    assert method is not None, f"procrastinate's Worker has no {name} any more"
    assert inspect.iscoroutinefunction(method) is is_coroutine
    assert parameters(method) == expected


def test_every_override_of_pgstages_worker_takes_its_base_methods_parameters():
    overrides = [
        name
        for name, member in vars(PgstageWorker).items()
        if callable(member)
        and not name.startswith("__")
        and hasattr(procrastinate_worker.Worker, name)
    ]

    assert set(overrides) >= {n for n in WORKER_METHODS if n in vars(PgstageWorker)}
    for name in overrides:
        base = getattr(procrastinate_worker.Worker, name)
        assert name in WORKER_METHODS, f"{name} is overridden but not pinned here"
        assert parameters(getattr(PgstageWorker, name)) == parameters(base), name


def test_the_worker_and_app_attributes_pgstage_uses_exist():
    app = App(connector=InMemoryConnector())
    worker = procrastinate_worker.Worker(app=app)

    assert [a for a in WORKER_ATTRIBUTES if not hasattr(worker, a)] == []
    assert [a for a in APP_ATTRIBUTES if not hasattr(app, a)] == []


def test_the_structural_public_names_keep_their_shape():
    assert parameters(manager.JobManager.fetch_job) == ("queues", "worker_id")
    assert parameters(manager.JobManager.register_worker) == ()
    assert inspect.iscoroutinefunction(manager.JobManager.fetch_job)
    assert parameters(periodic.PeriodicDeferrer.defer_jobs) == ("jobs_to_defer",)
    assert parameters(periodic.PeriodicDeferrer.__init__) == ("registry", "max_delay")
    assert parameters(jobs.Job.from_row) == ("row",)
    assert parameters(manager.get_channel_for_queues) == ("queues",)
    assert callable(django_utils.connector_params)
    # The worker command opens what this returns (queueing.worker.install replaces it).
    assert parameters(DjangoConnector.get_worker_connector) == ()
    assert "pool_factory" in inspect.signature(PsycopgConnector.__init__).parameters
    for name in ("timeout", "reconnect_timeout", "check"):
        assert (
            hasattr(AsyncConnectionPool, name)
            or name in inspect.signature(AsyncConnectionPool.__init__).parameters
        ), name


@pytest.mark.django_db
def test_the_sql_functions_pgstage_calls_exist_with_their_argument_types():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname LIKE 'procrastinate_%'"
        )
        present = {row[0] for row in cursor.fetchall()}

    assert [f for f in SQL_FUNCTIONS if f not in present] == []
