"""docs/api.md is the public API: every name it lists exists, every framework module it
lists is importable, and its settings table names exactly the settings the framework
reads."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.conftest import ROOT

PAGE = (ROOT / "docs" / "api.md").read_text()

PUBLIC = {
    "queueing.app": ["task", "periodic", "retired_task"],
    "queueing.keys": ["KeyFormat", "validate_key"],
    "queueing.enqueue": ["enqueue", "job_params", "Policy", "Enqueued"],
    "queueing.ledger": ["LedgerEntry", "Ledger", "Claim", "Outcome", "LedgerStatus"],
    "queueing.rows": ["replace_children", "insert_or_get"],
    "queueing.locks": ["namespace", "xact_lock", "try_xact_lock"],
    "queueing.serial": ["SerialQueue", "Admitted"],
    "queueing.sweeps": [
        "declare_sweep",
        "sweep_rows",
        "SweepContext",
        "SweepResult",
        "run_sweep",
        "request_sweep",
        "sweeps",
        "get_sweep",
        "watch",
        "Watch",
    ],
    "queueing.backoff": ["JitteredBackoff", "DEFAULT_RETRY", "retry_from_settings"],
    "queueing.exceptions": [
        "QueueingError",
        "RetryLater",
        "DoNotRetry",
        "LeaseLost",
        "InvalidKey",
        "LockOutsideTransaction",
        "UnknownTask",
        "UnknownSweep",
        "RowVanished",
        "PollLater",
        "JobTimedOut",
    ],
    "queueing.jobs": [
        "job_retry",
        "job_cancel",
        "Retried",
        "CancelRefused",
        "unrunnable_tasks",
        "Unrunnable",
    ],
    "queueing.logs": ["PlainFormatter", "JsonFormatter", "JobEventFilter", "register_key_format"],
    "queueing.health": ["healthz_view", "readyz_view", "readiness", "Check"],
    "queueing.metrics": ["metrics_view", "MetricSource", "Family", "PROCESS_REGISTRY"],
    "queueing.middleware": ["RequestMetricsMiddleware", "DatabaseUnavailableMiddleware"],
    "queueing.worker": ["install"],
    "queueing.worker_state": ["WorkerStateHandler"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_listed_name_exists_and_is_on_the_page(module):
    loaded = importlib.import_module(module)
    for name in PUBLIC[module]:
        assert hasattr(loaded, name), f"{module}.{name} is documented but does not exist"
        assert re.search(rf"`(?:{re.escape(module)}\.)?{name}\b", PAGE), (
            f"{module}.{name} is public but not on docs/api.md"
        )


def test_the_page_lists_no_other_module():
    listed = set(re.findall(r"`(queueing(?:\.[a-z_]+)+)`", PAGE))
    permissions = {"queueing.run_sweeps", "queueing.view_metrics"}
    assert listed <= set(PUBLIC) | permissions | {"queueing.gunicorn", "queueing.worker.install"}


def test_the_gunicorn_configuration_is_importable_without_django():
    importlib.import_module("queueing.gunicorn")


def settings_read() -> set[str]:
    """``getattr(settings, "NAME", ...)`` calls and ``*_setting="NAME"`` arguments in the
    framework's code (docstrings aside)."""
    names = set()
    for path in (ROOT / "queueing").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "settings"
                and isinstance(node.args[1], ast.Constant)
            ):
                names.add(node.args[1].value)
            for keyword in node.keywords:
                if (keyword.arg or "").endswith("_setting") and isinstance(
                    keyword.value, ast.Constant
                ):
                    names.add(keyword.value.value)
    return names - {"STATIC_ROOT"}


def test_the_settings_table_names_exactly_the_settings_the_framework_reads():
    table = PAGE.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", table, re.MULTILINE))
    assert settings_read() == documented
