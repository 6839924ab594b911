"""API plumbing shared by the domains: authentication, strict input schemas, cursor
pagination and the client-error contract.

Domain packages raise exceptions that subclass :class:`ClientError`; ``config.api`` turns
every one of them into ``{"error": code, "detail": ...}`` with the exception's status (and
headers, e.g. ``Retry-After``), in one place.

Authentication: a bearer token, or a logged-in session (CSRF-checked). A request that
sends an ``Authorization`` header is decided by its token alone: a wrong, revoked or
unknown token is a 401, never a fallback to the session (and never a CSRF 403). Failed
tokens count against the client's address (``accounts.throttle``).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Schema
from ninja.security import HttpBearer, SessionAuth
from pydantic import ConfigDict, ValidationInfo, field_validator

from accounts import throttle
from accounts.services import api_token_authenticate
from accounts.validation import unstorable_problem


class ErrorOut(Schema):
    """The body of every refusal: ``{"error": code, "detail": ...}``."""

    error: str
    detail: Any


class ClientError(Exception):
    """The request cannot be served as sent."""

    status: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        detail: Any = None,
        *,
        code: str | None = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ):
        self.detail = detail if detail is not None else self.__doc__
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})
        super().__init__(str(self.detail))


class NotFound(ClientError):
    """No such object (or it belongs to someone else)."""

    status = 404
    code = "not_found"


class TooManyRequests(ClientError):
    """A limit was reached; the ``Retry-After`` header says when to try again."""

    status = 429
    code = "too_many_requests"

    def __init__(self, detail: Any = None, *, code: str | None = None, retry_after: int):
        super().__init__(detail, code=code, headers={"Retry-After": str(retry_after)})


class StrictSchema(Schema):
    """Input bodies: unknown fields are refused, strings are stripped, and every string
    must be storable (no NUL, no lone surrogate), refused with 422 naming the field."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    @field_validator("*", mode="after")
    @classmethod
    def _storable(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str):
            problem = unstorable_problem(value)
            if problem is not None:
                raise ValueError(problem)
        return value


class BearerTokenAuth(HttpBearer):
    """``Authorization: Bearer <token>``; an address with too many failed tokens gets 429
    before its token is even looked up."""

    def authenticate(self, request: HttpRequest, token: str):
        address = throttle.client_address(request)
        refused = throttle.auth_throttle_check(scope=throttle.TOKEN, address=address)
        if refused is not None:
            raise TooManyRequests(
                refused.message, code="too_many_auth_failures", retry_after=refused.retry_after
            )
        user = api_token_authenticate(token=token)
        if user is None or user.tenant_id is None:
            throttle.auth_failure_record(scope=throttle.TOKEN, address=address)
            return None
        request.user = user
        return user


class TenantSessionAuth(SessionAuth):
    """Logged-in dashboard users call the same API with their session (CSRF-checked).

    Only a request without an ``Authorization`` header and with a logged-in session is
    checked here: an anonymous request is a 401 (not a CSRF 403), and a request that sent
    a token is decided by that token alone."""

    def __call__(self, request: HttpRequest):
        if "Authorization" in request.headers:
            return None
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or user.tenant_id is None:
            return None
        return super().__call__(request)

    def authenticate(self, request: HttpRequest, key: str | None):
        user = request.user
        if user.is_authenticated and user.tenant_id is not None:
            return user
        return None
