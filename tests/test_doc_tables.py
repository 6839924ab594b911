"""The tables of docs/operations.md and docs/api.md that describe code: each command table
lists exactly its commands, with options the commands have, and the admin table names
services that exist. (The settings table is checked in test_public_api.py, the metrics
table in site/test_metrics.py, the permissions table in
security/test_admin_permissions.py.)"""

from __future__ import annotations

import re

import pytest
from django.core.management import get_commands, load_command_class

from tests.conftest import ROOT

#: The framework's commands (docs/api.md), and procrastinate's, which it documents.
FRAMEWORK = {"run_all", "sweep", "worker_health"}
SITE_APPS = {"accounts", "config", "pipeline", "runs", "queueing"}


def command_rows(page: str) -> dict[str, str]:
    """The table under ``| command | what it does |``: command name → its first cell."""
    text = (ROOT / "docs" / page).read_text()
    table = text.split("| command | what it does |", 1)[1].split("\n\n", 1)[0]
    rows = {}
    for row in table.strip().splitlines()[1:]:
        cell = row.strip("|").split(" | ", 1)[0].strip().strip("`")
        rows[cell.split()[0]] = cell
    return rows


def project_commands() -> set[str]:
    return {name for name, app in get_commands().items() if app.split(".")[0] in SITE_APPS}


def test_the_scan_finds_the_commands():
    assert {"sweep", "replay_stage", "reset_auth_failures", "run_all"} <= project_commands()


def test_operations_lists_every_command_of_the_project():
    assert set(command_rows("operations.md")) == project_commands()


def test_the_api_page_lists_the_frameworks_commands():
    assert {name for name, app in get_commands().items() if app == "queueing"} == FRAMEWORK
    assert set(command_rows("api.md")) == FRAMEWORK | {"procrastinate"}


@pytest.mark.parametrize(
    ("page", "name"),
    [
        *(("operations.md", name) for name in sorted(command_rows("operations.md"))),
        *(("api.md", name) for name in sorted(command_rows("api.md")) if name != "procrastinate"),
    ],
)
def test_every_option_a_row_shows_is_the_commands(page, name):
    cell = command_rows(page)[name]
    command = load_command_class(get_commands()[name], name)
    options = set(command.create_parser("manage.py", name)._option_string_actions)
    shown = set(re.findall(r"--[a-z][a-z-]*", cell))
    assert shown - options == set(), f"{page}: {cell}"


def test_every_service_the_admin_table_names_exists():
    """docs/operations.md's admin actions call the services it names."""
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text.split("| where | action | service |", 1)[1].split("\n\n", 1)[0]
    named = {
        name
        for row in table.strip().splitlines()[1:]
        for name in re.findall(r"`(\w+)`", row.strip("|").rsplit(" | ", 1)[1])
    }
    defined = {
        match
        for package in SITE_APPS
        for path in (ROOT / package).rglob("*.py")
        for match in re.findall(r"^def (\w+)\(", path.read_text(), re.M)
    }
    assert len(named) >= 8
    assert named - defined == set()
