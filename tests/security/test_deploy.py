"""Deployment safety, through real processes reading real environment variables: with
DEBUG off the built-in development key stops every command and the WSGI application, and
``check --deploy`` is clean with the production settings docs/security.md documents.

Fault model:

* an operator forgets ``SECRET_KEY`` (or copies the development one) and turns DEBUG
  off: the commands' system check and the WSGI application both refuse to start
  (``test_the_development_key_with_debug_off_refuses_to_start``);
* development keeps working with DEBUG on (same test, the control case);
* the documented production variables leave no deployment warning
  (``test_check_deploy_passes_with_the_documented_production_settings``).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from config.settings import DEVELOPMENT_SECRET_KEY
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db

#: The production settings of docs/security.md and the README.
PRODUCTION = {
    "DEBUG": "false",
    "ALLOWED_HOSTS": "pgstage.example.com",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
}


def run(*args: str, **env: str) -> subprocess.CompletedProcess:
    from tests.conftest import database_url

    return subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url(), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(("debug", "refused"), [("false", True), ("true", False)])
def test_the_development_key_with_debug_off_refuses_to_start(debug, refused):
    env = {"DEBUG": debug, "SECRET_KEY": DEVELOPMENT_SECRET_KEY}

    check = run("manage.py", "check", **env)
    wsgi = run("-c", "import config.wsgi", **env)

    assert (check.returncode != 0) is refused, check.stderr
    assert (wsgi.returncode != 0) is refused, wsgi.stderr
    if refused:
        assert "site.E001" in check.stderr and "Set SECRET_KEY" in check.stderr
        assert "ImproperlyConfigured: site.E001" in wsgi.stderr


def test_check_deploy_passes_with_the_documented_production_settings():
    result = run(
        "manage.py",
        "check",
        "--deploy",
        "--fail-level",
        "WARNING",
        SECRET_KEY=secrets.token_urlsafe(50),
        **PRODUCTION,
    )

    assert result.returncode == 0, result.stderr + result.stdout
    assert "no issues" in result.stdout
