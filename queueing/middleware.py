"""Web middleware of the framework: request metrics, the database-outage answer, and the
answer to a query the database refuses.

:class:`RequestMetricsMiddleware` (put it first in ``MIDDLEWARE``) observes every
request's latency and status for ``/metrics`` (``pgstage_http_request_duration_seconds``).

:class:`DatabaseUnavailableMiddleware`: requests during a database outage get ``503
{"error": "database_unavailable"}`` with ``Retry-After``, not a 500 page.

Django raises ``OperationalError`` (or ``InterfaceError`` for a connection that died under
it) when PostgreSQL restarts, fails over or refuses connections. Nothing is wrong with the
request, so the answer says to try again. The web process needs no restart afterwards:
Django's connection health checks (``CONN_HEALTH_CHECKS``) drop a broken connection at
the next request, which opens a fresh one once the server is back.


:class:`RefusedQueryMiddleware`: a ``GET`` or ``HEAD`` whose query-string values the
database refuses (``DataError``: a NUL character in a text lookup, a label outside an enum
column's, such as procrastinate's job status, typed into an admin list's address) gets
``400 {"error": "invalid_query"}`` instead of a 500; one warning line is logged. Such a
request reads only, so nothing was written. Other methods keep their 500: their input is
validated by forms and services before it reaches the database.

A view's error is answered in :meth:`process_exception` (no traceback logged: one warning
line). An error inside another middleware (a session saved after the view) never reaches
that hook — Django turns it into a 500 first — so Django's ``got_request_exception``
signal marks the request and the 500 is replaced on its way out.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from django.core.signals import got_request_exception
from django.db import DataError, InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

__all__ = ["DatabaseUnavailableMiddleware", "RefusedQueryMiddleware", "RequestMetricsMiddleware"]

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 5
#: psycopg error classes (SQLSTATE prefixes) that mean "the server is not there": a
#: connection exception, an administrator's shutdown or crash, too many connections.
UNAVAILABLE_SQLSTATES = ("08", "57P", "53")
_MARK = "_pgstage_database_error"


def database_error(exc: BaseException | None) -> bool:
    return isinstance(exc, OperationalError | InterfaceError)


def _code(exc: BaseException) -> str:
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if sqlstate is None or sqlstate.startswith(UNAVAILABLE_SQLSTATES):
        return "database_unavailable"
    # A serialization failure, a deadlock, a statement timeout: retrying helps too.
    return "database_busy"


def unavailable_response(exc: BaseException) -> JsonResponse:
    code = _code(exc)
    detail = (
        "the database is not reachable right now; retry in a few seconds"
        if code == "database_unavailable"
        else "the database could not finish this request in time; retry in a few seconds"
    )
    response = JsonResponse({"error": code, "detail": detail}, status=503)
    response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


def _remember_database_error(
    sender: object, request: HttpRequest | None = None, **kwargs: Any
) -> None:
    exc = sys.exc_info()[1]
    if request is not None and database_error(exc):
        setattr(request, _MARK, exc)


got_request_exception.connect(_remember_database_error, dispatch_uid="pgstage-database-error")


class DatabaseUnavailableMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        exc = getattr(request, _MARK, None)
        if exc is not None and response.status_code == 500:
            return unavailable_response(exc)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not database_error(exception):
            return None
        logger.warning(
            "%s %s answered 503: database error %s: %s",
            request.method,
            request.path,
            type(exception).__name__,
            str(exception).strip().splitlines()[0] if str(exception).strip() else "",
        )
        return unavailable_response(exception)


class RefusedQueryMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DataError) or request.method not in ("GET", "HEAD"):
            return None
        logger.warning(
            "%s %s answered 400: the database refused a value of its query: %s",
            request.method,
            request.path,
            str(exception).strip().splitlines()[0] if str(exception).strip() else "",
        )
        return JsonResponse(
            {
                "error": "invalid_query",
                "detail": "a value in this address's query does not fit the column it filters "
                "(a NUL character, or a value outside the column's choices); nothing was written",
            },
            status=400,
        )


class RequestMetricsMiddleware:
    """Observes each request's duration and status; writes nothing to the database. An
    exception that leaves the middleware chain is observed as status 500."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from queueing.metrics import observe_request

        started = time.perf_counter()
        status = 500
        try:
            response = self.get_response(request)
            status = response.status_code
            return response
        finally:
            observe_request(request.method or "", status, time.perf_counter() - started)
