"""The README documents every environment variable the settings and the web server's
configuration read, and every management command of the project."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def variables_read() -> set[str]:
    settings = (ROOT / "config" / "settings.py").read_text()
    names = set(re.findall(r"^\s+([A-Z][A-Z0-9_]+)=\(", settings, re.MULTILINE))
    names |= set(re.findall(r'env(?:\.\w+)?\("([A-Z][A-Z0-9_]+)"', settings))
    names |= set(re.findall(r'_log_level\("([A-Z][A-Z0-9_]+)"', settings))
    names |= set(re.findall(r'os\.environ\.get\("([A-Z][A-Z0-9_]+)"', settings))
    gunicorn = (ROOT / "queueing" / "gunicorn.py").read_text()
    names |= set(re.findall(r'_int\("([A-Z][A-Z0-9_]+)"', gunicorn))
    names |= set(re.findall(r"os\.environ\.get\(['\"]([A-Z][A-Z0-9_]+)['\"]", gunicorn))
    return names


def test_the_scan_finds_the_variables():
    assert {"DATABASE_URL", "SECRET_KEY", "WEB_THREADS", "LOG_FORMAT", "HOST"} <= variables_read()


@pytest.mark.parametrize("name", sorted(variables_read()))
def test_every_environment_variable_is_documented(name):
    assert f"`{name}`" in README, f"{name} is read by the settings but not in the README"


def test_every_management_command_is_documented():
    commands = {
        path.stem
        for path in ROOT.glob("*/management/commands/*.py")
        if not path.stem.startswith("_") and path.stem != "demo"
    }
    assert "retry_analysis" in commands
    missing = sorted(c for c in commands if f"`{c}" not in README)
    assert missing == []
