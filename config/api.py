"""The JSON API: one NinjaAPI, the domains' routers, and every error mapped in one place.

Errors are ``{"error": code, "detail": …}`` with a 4xx status; OpenAPI docs at /api/docs.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from accounts.api import BearerTokenAuth, ClientError, TenantSessionAuth
from config.metrics import record_api_refusal

api = NinjaAPI(
    title="pgstage API",
    version="1",
    description="Inquiry pipelines and per-user analyses. Authenticate with "
    "`Authorization: Bearer <token>` (manage.py create_api_token) or a session.",
    auth=[BearerTokenAuth(), TenantSessionAuth()],
    urls_namespace="api",
)


def _error(request: HttpRequest, status: int, code: str, detail):
    record_api_refusal(request, code)
    return api.create_response(request, {"error": code, "detail": detail}, status=status)


@api.exception_handler(ClientError)
def on_client_error(request, exc: ClientError):
    return _error(request, exc.status, exc.code, exc.detail)


@api.exception_handler(ValidationError)
def on_validation_error(request, exc: ValidationError):
    return _error(request, 422, "invalid_payload", exc.errors)


@api.exception_handler(AuthenticationError)
def on_auth_error(request, exc):
    return _error(
        request,
        401,
        "unauthenticated",
        "send 'Authorization: Bearer <token>' (manage.py create_api_token)",
    )


@api.exception_handler(Http404)
def on_not_found(request, exc):
    return _error(request, 404, "not_found", "no such object")


@api.exception_handler(HttpError)
def on_http_error(request, exc: HttpError):
    return _error(request, exc.status_code, "http_error", str(exc))


def register_routers() -> None:
    """Attach each domain's router (imported here: only config knows every domain)."""
    from pipeline.api import router as pipeline_router
    from runs.api import router as runs_router

    api.add_router("/", pipeline_router)
    api.add_router("/", runs_router)
