"""Deployment safety, through real processes reading real environment variables: with
DEBUG off the built-in development key stops every command and the WSGI application, and
``check --deploy`` is clean with the production settings docs/security.md documents.

Fault model:

* an operator forgets ``SECRET_KEY`` (or copies the development one, or sets ``x`` or
  ``changeme``) and turns DEBUG off: the commands' system check and the WSGI application
  both refuse to start (``test_a_weak_key_with_debug_off_refuses_to_start``);
* development keeps working with DEBUG on, and a strong key starts (same test, the
  control cases);
* a bound set below 0 (``test_a_negative_bound_refuses_to_start``);
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


#: Keys that must not sign production sessions: the development key, and what Django's
#: own deployment check calls weak (security.W009).
WEAK_KEYS = [
    DEVELOPMENT_SECRET_KEY,
    "x",
    "changeme",
    "a" * 80,
    "abcd" * 20,
    "django-insecure-" + "q8Vf3kLm0pZr7TbXw2Yc9HnJd4Gs6Ae1Ui5Oo" * 2,
    "q8Vf3kLm0pZr7TbXw2Yc9HnJd4Gs6Ae1Ui5Oo",  # 37 characters
]
#: Parameters are fixed (pytest-xdist's workers must collect the same ids).
STRONG_KEY = "Xk3_pR9vLq0wZt7mYc2nBf8hJd4sGa6eUi1oO5lKj-NbVx0Qr" * 2


@pytest.mark.parametrize(
    ("key", "debug", "refused"),
    [
        *[(key, "false", True) for key in WEAK_KEYS],
        (DEVELOPMENT_SECRET_KEY, "true", False),
        (STRONG_KEY, "false", False),
    ],
    ids=lambda value: value[:16] if isinstance(value, str) else None,
)
def test_a_weak_key_with_debug_off_refuses_to_start(key, debug, refused):
    env = {"DEBUG": debug, "SECRET_KEY": key}

    check = run("manage.py", "check", **env)
    wsgi = run("-c", "import config.wsgi", **env)

    assert (check.returncode != 0) is refused, check.stderr
    assert (wsgi.returncode != 0) is refused, wsgi.stderr
    if refused:
        assert "site.E001" in check.stderr and "Set SECRET_KEY" in check.stderr
        assert len(key) < 9 or key not in check.stderr  # a key is never printed
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


def test_a_negative_bound_refuses_to_start():
    result = run("manage.py", "check", CORE_DAILY_BUDGET="-1")

    assert result.returncode != 0
    assert "site.E003" in result.stderr and "CORE_DAILY_BUDGET is negative" in result.stderr


def test_a_fresh_checkout_starts_without_warnings(tmp_path):
    """Before any collectstatic (STATIC_ROOT missing), loading the web stack says nothing."""
    result = run(
        "-W",
        "default",
        "-c",
        "import django; django.setup(); "
        "from django.core.handlers.wsgi import WSGIHandler; WSGIHandler()",
        DJANGO_SETTINGS_MODULE="config.settings",
        STATIC_ROOT=str(tmp_path / "never-collected"),
    )

    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
