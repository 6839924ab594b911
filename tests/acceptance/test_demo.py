"""`make demo` is one of the README's two commands: run it end to end on the test database
with real workers, and check what it reports."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import database_url
from tests.invariants import assert_invariants

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.mark.slow
def test_demo_runs_every_feature_end_to_end(clean_queue, monkeypatch, settings, tmp_path):
    monkeypatch.setenv("DATABASE_URL", database_url())
    monkeypatch.setenv("STORAGE_ROOT", str(tmp_path / "storage"))
    settings.STORAGE_ROOT = tmp_path / "storage"
    settings.DATA_DIR = tmp_path
    # The demo shortens the grace window in-process; registering the setting here makes
    # the fixture restore it for the tests that follow.
    settings.SWEEP_GRACE_SECONDS = 120
    out = io.StringIO()
    call_command("demo", stdout=out, stderr=io.StringIO())
    text = out.getvalue()
    stages = "intake:success → extract:success → feasibility:success → calculate:success"
    assert text.count(stages) == 3
    # Five analyses for one user: one started at the click, four queued in order.
    admitted = re.findall(r"^\s*\d+\s+(pending|queued)\s+(\d+)$", text, re.MULTILINE)
    assert admitted == [("pending", "0")] + [("queued", str(n)) for n in range(1, 5)]
    assert text.count(" complete ") == 5
    # Four runs saved by the browser, the closed tab's run rescued by the sweep.
    assert text.count("client") == 4 and "worker" in text
    assert "unsaved_runs         1        1       0" in text
    assert "workers drained on SIGTERM, exit codes [0, 0]" in text
    assert_invariants(settled=True)
    # The README's logins work: the dashboard for alice, the admin for admin.
    from django.test import Client

    assert Client().login(username="alice", password="alice")
    assert Client().login(username="admin", password="admin")


def test_demo_refuses_bad_options():
    with pytest.raises(CommandError, match="--workers must be at least 1"):
        call_command("demo", workers=0)
    with pytest.raises(CommandError, match="--grace must be 0 or more"):
        call_command("demo", grace=-1)


def test_the_commands_it_points_to_name_the_python_that_has_the_project(monkeypatch, tmp_path):
    """A fresh clone's ``python`` has no Django: the summary names the one that ran it."""
    from config.management.commands import demo

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(demo.sys, "executable", str(tmp_path / ".venv" / "bin" / "python"))
    assert demo.manage_py("queue_status") == ".venv/bin/python manage.py queue_status"
    monkeypatch.setattr(demo.sys, "executable", "/usr/local/bin/python3")
    assert demo.manage_py("queue_status") == "/usr/local/bin/python3 manage.py queue_status"
