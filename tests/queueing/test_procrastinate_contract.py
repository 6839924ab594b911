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
  ``install()`` and the worker rely on (``App._worker``, which ``install()`` replaces,
  called with keywords only);
* the helpers of ``procrastinate.utils`` (an internal module) the worker calls, and a
  scan of ``queueing/`` that fails on any other name of an internal module or any
  private module-level name of procrastinate it reads;
* the public-but-structural names: ``JobManager.fetch_job`` / ``register_worker``,
  ``PeriodicDeferrer.defer_jobs``, ``Job.from_row``, ``Task.get_retry_exception``,
  ``JobContext.task``, ``get_channel_for_queues``,
  ``connector_params``, and psycopg_pool's ``timeout``, ``reconnect_timeout`` and
  ``check()``;
* the connector's internals ``queueing.planner`` runs its index walks through
  (``_get_cursor``, ``_wrap_json``, ``pool``, ``wrap_exceptions``), as
  ``execute_query_all_async`` uses them;
* the worker's connector (``queueing.connector``): procrastinate's command asks the Django
  app's connector for it (``get_worker_connector``), and ``PsycopgConnector`` builds its
  pool through ``pool_factory``, passing the ``check`` ours replaces;
* procrastinate's SQL functions pgstage's statements call, with their argument types, in
  the migrated database (``procrastinate_fetch_job_v2``'s body is pinned separately, in
  ``tests/queueing/test_fetch.py``, and the defer's in ``test_enqueue.py``).
"""

from __future__ import annotations

import ast
import inspect
from importlib.metadata import version
from pathlib import Path

import pytest
from django.db import connection
from packaging.specifiers import SpecifierSet
from procrastinate import App, job_context, jobs, manager, periodic, tasks
from procrastinate import utils as procrastinate_utils
from procrastinate import worker as procrastinate_worker
from procrastinate.contrib.django import utils as django_utils
from procrastinate.contrib.django.django_connector import DjangoConnector
from procrastinate.psycopg_connector import PsycopgConnector
from procrastinate.testing import InMemoryConnector
from psycopg_pool import AsyncConnectionPool

from queueing.worker import PgstageWorker
from tests.conftest import ROOT

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
    "concurrency",
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
#: ``procrastinate.utils`` (an internal module, no API of procrastinate's) functions the
#: worker calls: name -> (is a coroutine function, its parameters).
UTILS_FUNCTIONS: dict[str, tuple[bool, tuple[str, ...]]] = {
    "utcnow": (False, ()),
    "cancel_and_capture_errors": (True, ("tasks",)),
    "queues_display": (False, ("queues",)),
}
#: procrastinate's modules whose every name the framework uses is pinned here (the
#: private ones of the others too).
INTERNAL_MODULES = {"procrastinate.utils"}
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


def test_the_worker_builder_install_replaces_takes_keywords_only():
    """``install`` puts ``build_worker(**kwargs)`` in place of ``App._worker``, which
    procrastinate calls with the worker's options as keywords."""
    signature = inspect.signature(App._worker)
    assert [p.kind for p in signature.parameters.values() if p.name != "self"] == [
        inspect.Parameter.VAR_KEYWORD
    ]
    assert "self._worker(**kwargs)" in inspect.getsource(App.run_worker_async)
    assert "task_middleware" in inspect.signature(procrastinate_worker.Worker).parameters


@pytest.mark.parametrize("name", sorted(UTILS_FUNCTIONS))
def test_each_internal_helper_pgstage_calls_is_there_as_it_expects(name):
    is_coroutine, expected = UTILS_FUNCTIONS[name]
    func = getattr(procrastinate_utils, name, None)

    assert func is not None, f"procrastinate.utils has no {name} any more"
    assert inspect.iscoroutinefunction(func) is is_coroutine
    assert parameters(func) == expected


def procrastinate_names_used(root: Path) -> set[str]:
    """``module.name`` for each name the framework's code reads from one of procrastinate's
    modules that is private (``_name``) or from an internal module."""
    used = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("procrastinate"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    aliases[alias.asname or alias.name] = full
                    if alias.name.startswith("_") or node.module in INTERNAL_MODULES:
                        used.add(full)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("procrastinate"):
                        aliases[alias.asname or alias.name] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
            ):
                module = aliases[node.value.id]
                if node.attr.startswith("_") or module in INTERNAL_MODULES:
                    used.add(f"{module}.{node.attr}")
    return used


def test_every_internal_procrastinate_name_the_framework_uses_is_pinned():
    pinned = {f"procrastinate.utils.{name}" for name in UTILS_FUNCTIONS}
    assert procrastinate_names_used(ROOT / "queueing") <= pinned


def test_the_name_finder_sees_internal_and_private_names(tmp_path):
    (tmp_path / "x.py").write_text(
        "from procrastinate import utils, worker as w\n"
        "from procrastinate.utils import queues_display\n"
        "utils.utcnow()\nw._helper()\nw.Worker\n"
    )
    assert procrastinate_names_used(tmp_path) == {
        "procrastinate.utils.utcnow",
        "procrastinate.utils.queues_display",
        "procrastinate.worker._helper",
    }


def test_the_structural_public_names_keep_their_shape():
    assert parameters(manager.JobManager.fetch_job) == ("queues", "worker_id")
    assert parameters(manager.JobManager.register_worker) == ()
    assert inspect.iscoroutinefunction(manager.JobManager.fetch_job)
    assert parameters(periodic.PeriodicDeferrer.defer_jobs) == ("jobs_to_defer",)
    assert parameters(periodic.PeriodicDeferrer.__init__) == ("registry", "max_delay")
    assert parameters(jobs.Job.from_row) == ("row",)
    # Stalled recovery asks a timed-out job's task for its retry decision; the worker's
    # async middleware reads the job's task from its context.
    assert parameters(tasks.Task.get_retry_exception) == ("exception", "job")
    assert isinstance(inspect.getattr_static(job_context.JobContext, "task"), property)
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


def test_the_connector_internals_the_index_walks_run_through_are_there():
    """``queueing.planner`` runs the fetch as procrastinate's connector runs a statement
    (a dict-row cursor on a pooled connection, JSON arguments wrapped, psycopg's errors
    wrapped), with its planner settings in the same pipeline."""
    from procrastinate import psycopg_connector

    assert inspect.isfunction(psycopg_connector.wrap_exceptions)
    assert parameters(PsycopgConnector._get_cursor) == ("connection",)
    assert parameters(PsycopgConnector._wrap_json) == ("arguments",)
    assert isinstance(inspect.getattr_static(PsycopgConnector, "pool"), property)
    body = inspect.getsource(PsycopgConnector.execute_query_all_async)
    assert "self._get_cursor()" in body
    assert "cursor.execute(query, self._wrap_json(arguments))" in body


def test_the_job_admin_column_pgstage_restyles_is_still_shown():
    """``queueing.admin.JobAdmin.pretty_args`` replaces procrastinate's inline-styled
    rendering of the arguments; under another name it would be bypassed."""
    from procrastinate.contrib.django.admin import ProcrastinateJobAdmin

    assert "pretty_args" in ProcrastinateJobAdmin.list_display
    assert "pretty_args" in ProcrastinateJobAdmin.fields


def test_the_worker_command_takes_the_connector_install_gives_and_its_pool_takes_our_check():
    """procrastinate's ``procrastinate`` command asks the Django app's connector for the
    worker's (``get_worker_connector``, which ``install`` points at
    ``queueing.connector.worker_connector``), and its connector builds the pool through
    ``pool_factory`` with its own round-trip ``check``, which ours replaces."""
    import asyncio

    from procrastinate import psycopg_connector
    from procrastinate.contrib.django import app as django_app
    from procrastinate.contrib.django.management.commands import procrastinate as command

    from queueing import connector as queueing_connector

    assert "get_worker_connector()" in inspect.getsource(command.Command.handle)
    built = django_app.connector.get_worker_connector()
    assert isinstance(built, psycopg_connector.PsycopgConnector)
    assert built._pool_factory is queueing_connector._pool

    seen: dict = {}
    connector = psycopg_connector.PsycopgConnector(pool_factory=lambda **kw: seen.update(kw))
    asyncio.run(connector._create_pool(connector._pool_args))
    assert seen["check"] == AsyncConnectionPool.check_connection
    pool = queueing_connector._pool(open=False, check=AsyncConnectionPool.check_connection)
    # The worker's pool applies it itself (queueing.outage.WorkerPool), not psycopg_pool.
    assert pool.lent_check is queueing_connector._check
    assert pool._check is None


@pytest.mark.django_db
def test_the_sql_functions_pgstage_calls_exist_with_their_argument_types():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.oid::regprocedure::text FROM pg_proc p WHERE p.proname LIKE 'procrastinate_%'"
        )
        present = {row[0] for row in cursor.fetchall()}

    assert [f for f in SQL_FUNCTIONS if f not in present] == []
