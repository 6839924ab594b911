"""Rate limits on failed authentication per client address: wrong passwords (the login
pages) and wrong, revoked or unknown API tokens.

An address that failed ``AUTH_FAILURE_LIMIT`` times within ``AUTH_FAILURE_WINDOW_SECONDS``
is refused (429, with ``Retry-After``) until its window ends, even with the right
credentials, so guessing stops paying off; 0 for either setting turns the limit off.
The counts live in PostgreSQL (one row per scope and address), so every web process sees
the same counts and a restart forgets none. Rows of ended windows are pruned a few at a
time by later failures: the table only grows with failures, and every failure prunes.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass
from importlib import resources

from django.conf import settings
from django.db import connection
from django.http import HttpRequest
from django.utils import timezone

from accounts.models import AuthFailure

LOGIN = "login"
TOKEN = "token"
#: Ended windows deleted per recorded failure.
PRUNE_BATCH = 50
_RECORD = resources.files("accounts").joinpath("sql", "auth_failure_record.sql").read_text()
_ADDRESS_MAX = AuthFailure._meta.get_field("address").max_length


@dataclass(frozen=True, kw_only=True)
class Throttled:
    """An address is over its limit: refuse it for ``retry_after`` seconds."""

    scope: str
    retry_after: int

    @property
    def message(self) -> str:
        what = "failed logins" if self.scope == LOGIN else "failed token authentications"
        return f"too many {what} from this address; try again in {self.retry_after} second(s)"


def _limit() -> int:
    return int(settings.AUTH_FAILURE_LIMIT)


def _window() -> int:
    return int(settings.AUTH_FAILURE_WINDOW_SECONDS)


def client_address(request: HttpRequest) -> str:
    """The caller's address: ``REMOTE_ADDR``, or behind ``TRUSTED_PROXY_HOPS`` reverse
    proxies the address the outermost trusted proxy saw (counted from the right of
    ``X-Forwarded-For``, which a client can prepend to but not append to)."""
    address = request.META.get("REMOTE_ADDR", "") or "unknown"
    hops = int(getattr(settings, "TRUSTED_PROXY_HOPS", 0))
    if hops > 0:
        forwarded = [part.strip() for part in request.headers.get("X-Forwarded-For", "").split(",")]
        forwarded = [part for part in forwarded if part]
        if len(forwarded) >= hops:
            address = forwarded[-hops]
    return address[:_ADDRESS_MAX]


def auth_throttle_check(*, scope: str, address: str) -> Throttled | None:
    """None while ``address`` may try again, else how long it must wait. One read
    (none while the limit is off: ``AUTH_FAILURE_LIMIT`` 0)."""
    if _limit() <= 0:
        return None
    row = (
        AuthFailure.objects.filter(scope=scope, address=address)
        .values_list("failures", "window_start")
        .first()
    )
    if row is None or row[0] < _limit():
        return None
    ends = row[1] + datetime.timedelta(seconds=_window())
    remaining = (ends - timezone.now()).total_seconds()
    if remaining <= 0:
        return None
    return Throttled(scope=scope, retry_after=max(1, math.ceil(remaining)))


def auth_failure_record(*, scope: str, address: str) -> int:
    """Count one failure of ``address`` (one UPSERT; concurrent failures all count) and
    prune a few rows of ended windows; returns the failures in the current window."""
    with connection.cursor() as cursor:
        cursor.execute(_RECORD, {"scope": scope, "address": address, "window": _window()})
        (failures,) = cursor.fetchone()
    cutoff = timezone.now() - datetime.timedelta(seconds=_window())
    ended = AuthFailure.objects.filter(window_start__lt=cutoff).values("pk")[:PRUNE_BATCH]
    AuthFailure.objects.filter(pk__in=ended).delete()
    return failures


def auth_failures_reset(*, address: str | None = None, scope: str | None = None) -> int:
    """Forget the failures of ``address`` (every address when None) in ``scope`` (both
    when None), lifting their lockout at once; returns the rows deleted. Idempotent: a
    second call deletes nothing. A failure recorded concurrently starts a new window."""
    rows = AuthFailure.objects.all()
    if address is not None:
        rows = rows.filter(address=address)
    if scope is not None:
        rows = rows.filter(scope=scope)
    deleted, _ = rows.delete()
    return deleted


def locked_until(failure: AuthFailure) -> datetime.datetime | None:
    """When the lockout of ``failure``'s address ends, or None when it is not locked out."""
    if _limit() <= 0 or failure.failures < _limit():
        return None
    ends = failure.window_start + datetime.timedelta(seconds=_window())
    return ends if ends > timezone.now() else None
