"""The web process rides out a database outage: gunicorn serving pgstage against a private
PostgreSQL that the test stops (fast shutdown) and starts again.

Fault model, one cell per step of a request:

* the server is gone when a request needs it (connection refused) → JSON 503 with
  ``Retry-After`` from the API (``test_api_answers_503_then_recovers``) and ``/readyz``
  says not ready while ``/healthz`` stays alive (same test);
* the server went away under a kept-alive connection (Django's ``CONN_MAX_AGE``) → the
  first request after the restart is served on a fresh connection, with no restart of
  the web process: its pid is unchanged (same test);
* an error raised inside a middleware rather than a view → still a 503
  (``test_middleware_errors_become_503``).
"""

from __future__ import annotations

import os

import pytest
from django.db import OperationalError
from django.http import HttpResponse
from django.test import RequestFactory

from queueing.middleware import DatabaseUnavailableMiddleware
from tests.servers import PrivatePostgres, http, manage, start_web, wait_until


@pytest.fixture
def private_postgres():
    server = PrivatePostgres()
    yield server
    server.remove()


@pytest.mark.slow
def test_api_answers_503_then_recovers(private_postgres, tmp_path):
    url = private_postgres.create_database("pgstage")
    env = {**os.environ, "DATABASE_URL": url, "PGSTAGE_DATA_DIR": str(tmp_path / "data")}
    manage("migrate", "--noinput", "-v", "0", env=env)
    token = manage("create_api_token", "--tenant", "acme", "--user", "alice", env=env)
    auth = {"Authorization": f"Bearer {token.strip().splitlines()[-1]}"}
    web = start_web(env, tmp_path / "web.log", WEB_WORKERS=1, WEB_THREADS=2)
    try:
        runs = f"{web.url}/api/analysis-runs"
        assert http("GET", runs, headers=auth).status == 200
        ready = http("GET", f"{web.url}/readyz").json()
        assert ready["checks"]["database"]["ok"] is True

        private_postgres.stop()
        for _ in range(3):  # every thread's kept-alive connection is dead, not just one
            reply = http("GET", runs, headers=auth)
            assert reply.status == 503, reply.body
            assert reply.json()["error"] == "database_unavailable"
            assert int(reply.headers["Retry-After"]) > 0
        admit = http("POST", f"{web.url}/api/analysis-jobs", headers=auth, body={"title": "x"})
        assert admit.status == 503, admit.body
        ready = http("GET", f"{web.url}/readyz")
        assert ready.status == 503
        assert ready.json()["checks"]["database"]["ok"] is False
        assert http("GET", f"{web.url}/healthz").status == 200

        private_postgres.start()
        wait_until(
            lambda: http("GET", runs, headers=auth).status == 200,
            timeout=30,
            message="the API to answer again after the database came back",
        )
        for _ in range(4):
            assert http("GET", runs, headers=auth).status == 200
        assert http("GET", f"{web.url}/readyz").json()["checks"]["database"]["ok"] is True
        assert web.process.poll() is None, "the web process must not have been restarted"
        assert "Traceback" not in web.log()
    finally:
        web.stop()


def test_middleware_errors_become_503():
    """An error inside another middleware reaches Django's 500 path, not the view's
    exception hook: the got_request_exception mark still turns it into a 503."""
    from django.core.handlers.exception import response_for_exception

    request = RequestFactory().get("/dashboard/")

    def inner(request):
        try:
            raise OperationalError("server closed the connection unexpectedly")
        except OperationalError as exc:
            return response_for_exception(request, exc)

    response = DatabaseUnavailableMiddleware(inner)(request)
    assert response.status_code == 503
    assert response["Retry-After"]


def test_other_errors_are_left_alone():
    request = RequestFactory().get("/")
    middleware = DatabaseUnavailableMiddleware(lambda r: HttpResponse(status=500))
    assert middleware(request).status_code == 500
    assert middleware.process_exception(request, ValueError("boom")) is None
