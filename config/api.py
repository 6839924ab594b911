"""The JSON API: one NinjaAPI, the domains' routers, and every error mapped in one place.

Errors are ``{"error": code, "detail": …}`` with a 4xx status; OpenAPI docs at /api/docs.
"""

from __future__ import annotations

from django.http import Http404, HttpRequest
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError, ValidationError

from accounts.api import BearerTokenAuth, ClientError, TenantSessionAuth
from config.metrics import record_api_refusal

ERROR_SCHEMA = {
    "title": "Error",
    "type": "object",
    "required": ["error", "detail"],
    "properties": {
        "error": {"type": "string", "description": "machine-readable code, e.g. not_found"},
        "detail": {"description": "what went wrong and what to do (text or a list of errors)"},
    },
}


class PgstageAPI(NinjaAPI):
    """Documents the error contract on every operation: each answers ``4XX`` with the
    ``Error`` body, the codes of one place (the exception handlers below)."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        schema.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
        error = {
            "description": "Refused: the body names the reason (`error`) and what to do.",
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for operations in schema["paths"].values():
            for operation in operations.values():
                operation.setdefault("responses", {}).setdefault("4XX", error)
        return schema


api = PgstageAPI(
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
