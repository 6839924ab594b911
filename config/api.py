"""The JSON API: one NinjaAPI, the domains' routers, and every error mapped in one place.

Errors are ``{"error": code, "detail": …}`` with a 4xx status; OpenAPI docs at /api/docs.
The exception handlers below map what the views, the parsers and Django raise;
:func:`api_error_middleware` is the net under them, so that whatever else answers under
``/api/`` with an error (Django's 404 for an unknown path, ninja's 405 for a wrong method)
answers in the same shape.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import DataError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.parser import Parser

from accounts.api import BearerTokenAuth, ClientError, TenantSessionAuth
from config.metrics import record_api_refusal

logger = logging.getLogger(__name__)

API_PREFIX = "/api/"
JSON = "application/json"
#: The challenge of every 401 (RFC 6750); a token that was sent but refused adds
#: ``error="invalid_token"``.
REALM = 'Bearer realm="pgstage"'

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "machine-readable code, e.g. not_found"},
        "detail": {"description": "what went wrong and what to do (text or a list of errors)"},
    },
}

#: Codes for the statuses Django or ninja answer on their own (no exception of ours).
STATUS_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


class JsonOnlyParser(Parser):
    """Bodies of JSON operations: ``application/json`` only (415 otherwise), and a body
    that is not JSON is a 400 naming where it broke."""

    def parse_body(self, request: HttpRequest):
        content_type = (request.content_type or "").lower()
        if content_type != JSON:
            raise ClientError(
                f"send the body as {JSON} (got {content_type or 'no Content-Type'})",
                code="unsupported_media_type",
                status=415,
            )
        try:
            return json.loads(request.body)
        except (ValueError, RecursionError) as exc:
            raise ClientError(f"the body is not valid JSON: {exc}", code="invalid_json") from exc


class PgstageAPI(NinjaAPI):
    """Documents the error contract on every operation: each answers ``4XX`` with the
    ``Error`` body, the codes of one place (the exception handlers below)."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
        error = {
            "description": "Refused: the body names the reason (`error`) and what to do.",
            "content": {JSON: {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation.setdefault("responses", {}).setdefault("4XX", error)
        return schema


api = PgstageAPI(
    title="pgstage API",
    version="1",
    description=(
        "Inquiry pipelines and per-user analyses. Authenticate with "
        "`Authorization: Bearer <token>` (manage.py create_api_token) or a session. "
        "JSON bodies are `application/json`, at most "
        f"{settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes (413 beyond). Lists are newest "
        "first and paginated by cursor: the `Link` header names the next page "
        '(`rel="next"`); there is none on the last page.'
    ),
    auth=[BearerTokenAuth(), TenantSessionAuth()],
    parser=JsonOnlyParser(),
    urls_namespace="api",
)


def _response(
    request: HttpRequest,
    status: int,
    code: str,
    detail,
    headers: dict[str, str] | None = None,
) -> HttpResponse:
    response = api.create_response(request, {"error": code, "detail": detail}, status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def _error(request: HttpRequest, status: int, code: str, detail, headers=None) -> HttpResponse:
    record_api_refusal(request, code)
    return _response(request, status, code, detail, headers)


@api.exception_handler(ClientError)
def on_client_error(request, exc: ClientError):
    if exc.status == 429 and exc.code == "too_many_auth_failures":
        # A refused credential is not a refused admission (metrics count only those).
        return _response(request, exc.status, exc.code, exc.detail, exc.headers)
    return _error(request, exc.status, exc.code, exc.detail, exc.headers)


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    return _error(request, 422, "invalid_payload", exc.errors)


@api.exception_handler(AuthenticationError)
def on_auth_error(request, exc):
    challenge = REALM + (', error="invalid_token"' if "Authorization" in request.headers else "")
    return _response(
        request,
        401,
        "unauthenticated",
        "send 'Authorization: Bearer <token>' with a valid token (manage.py create_api_token)",
        {"WWW-Authenticate": challenge},
    )


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _error(request, 404, "not_found", "no such object")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    # ninja wraps what the body parser raises; ours carries its own status and code.
    if isinstance(exc.__cause__, ClientError):
        return on_client_error(request, exc.__cause__)
    code = STATUS_CODES.get(exc.status_code, "http_error")
    return _error(request, exc.status_code, code, str(exc))


@api.exception_handler(RequestDataTooBig)
def on_body_too_big(request, exc):
    return _error(
        request,
        413,
        "payload_too_large",
        f"the body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE:,} bytes",
    )


@api.exception_handler(TooManyFieldsSent)
def on_too_many_fields(request, exc):
    return _error(request, 400, "too_many_fields", str(exc))


@api.exception_handler(TooManyFilesSent)
def on_too_many_files(request, exc):
    return _error(request, 413, "too_many_files", str(exc))


@api.exception_handler(MultiPartParserError)
def on_bad_multipart(request, exc):
    return _error(request, 400, "invalid_multipart", f"the multipart body is malformed: {exc}")


@api.exception_handler(DataError)
def on_data_error(request, exc):
    # Input should have been refused before it reached the database; the database's own
    # words (table and column names, values) stay in the log.
    logger.exception("a value reached the database unchecked: %s %s", request.method, request.path)
    return _error(
        request,
        422,
        "unstorable_value",
        "a value does not fit where it is stored; nothing was written",
    )


def api_error_middleware(get_response: Callable[[HttpRequest], HttpResponse]):
    """Under ``/api/``, turn every error answer that is not JSON (Django's 404 page,
    ninja's 405 text, Django's own 400 and 500 pages) into the one error shape, keeping
    its status and headers such as ``Allow``."""

    def middleware(request: HttpRequest) -> HttpResponse:
        response = get_response(request)
        if (
            not request.path.startswith(API_PREFIX)
            or response.status_code < 400
            or response.get("Content-Type", "").startswith(JSON)
        ):
            return response
        status = response.status_code
        if status >= 500:
            code, detail = "internal_error", "the server failed; the error is logged"
        else:
            code = STATUS_CODES.get(status, "http_error")
            detail = _detail(request, status, response)
        shaped = JsonResponse({"error": code, "detail": detail}, status=status)
        for name in ("Allow", "Retry-After", "WWW-Authenticate"):
            if name in response:
                shaped[name] = response[name]
        return shaped

    return middleware


def _detail(request: HttpRequest, status: int, response: HttpResponse) -> str:
    if status == 404:
        return f"no such API path: {request.path} (see /api/docs)"
    if status == 405:
        return f"{request.method} is not allowed here; allowed: {response.get('Allow', '')}"
    return HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "refused"


def register_routers() -> None:
    """Attach each domain's router (imported here: only config knows every domain)."""
    from pipeline.api import router as pipeline_router
    from runs.api import router as runs_router

    api.add_router("/", pipeline_router)
    api.add_router("/", runs_router)
