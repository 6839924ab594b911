"""Property test of the whole JSON API: requests generated from its own OpenAPI schema
(valid and invalid bodies, paths and headers) never get a server error.

Runs through the WSGI application against the test database; each example is one request
by an authenticated user with credits."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from accounts.services import api_token_create
from config.wsgi import application
from runs.credits import credit_grant
from tests.factories import TenantFactory, UserFactory

#: The plugin turns ``schema.parametrize()`` into test cases; the suite loads no plugin
#: by itself (pyproject.toml's addopts), so this module asks for it.
pytest_plugins = ["schemathesis.pytest.plugin"]

schema = schemathesis.openapi.from_wsgi("/api/openapi.json", application)

pytestmark = [pytest.mark.slow]


@pytest.fixture
def keep_test_connection():
    """Requests go through the WSGI handler, whose request signals would close the test's
    connection (and its transaction); Django's test client unhooks them the same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def token(db, settings_storage, keep_test_connection):
    user = UserFactory(username="fuzzer", tenant=TenantFactory(slug="fuzz"))
    credit_grant(user_id=user.id, amount=10_000)
    return api_token_create(user=user)


@pytest.fixture
def settings_storage(settings, tmp_path):
    settings.STORAGE_ROOT = tmp_path / "storage"


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_request_gets_a_server_error(case, token):
    case.call_and_validate(
        headers={"Authorization": f"Bearer {token}"}, checks=[not_a_server_error]
    )
