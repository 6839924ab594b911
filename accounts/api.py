"""API plumbing shared by the domains: bearer-token auth and the client-error contract.

Domain packages raise exceptions that subclass :class:`ClientError`; ``config.api`` turns
every one of them into ``{"error": code, "detail": ...}`` with the exception's status, in
one place.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Schema
from ninja.security import HttpBearer, SessionAuth

from accounts.services import api_token_authenticate


class ErrorOut(Schema):
    """The body of every refusal: ``{"error": code, "detail": ...}``."""

    error: str
    detail: Any


class ClientError(Exception):
    """The request cannot be served as sent."""

    status: int = 400
    code: str = "bad_request"

    def __init__(self, detail: Any = None, *, code: str | None = None, status: int | None = None):
        self.detail = detail if detail is not None else self.__doc__
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        super().__init__(str(self.detail))


class NotFound(ClientError):
    """No such object (or it belongs to someone else)."""

    status = 404
    code = "not_found"


class BearerTokenAuth(HttpBearer):
    def authenticate(self, request: HttpRequest, token: str):
        user = api_token_authenticate(token=token)
        if user is None or user.tenant_id is None:
            return None
        request.user = user
        return user


class TenantSessionAuth(SessionAuth):
    """Logged-in dashboard users call the same API with their session (CSRF-checked)."""

    def authenticate(self, request: HttpRequest, key: str | None):
        user = request.user
        if user.is_authenticated and user.tenant_id is not None:
            return user
        return None
