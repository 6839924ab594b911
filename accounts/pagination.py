"""Cursor (keyset) pagination for the API's lists.

A page is the rows after the cursor in a fixed order that ends with a unique column, so a
row inserted meanwhile lands before the first page (lists are newest first) and never
shifts or repeats a later page. The cursor is opaque to clients: the last row's sort
values, JSON in URL-safe base64. The next page's URL goes in the ``Link`` header
(RFC 8288, ``rel="next"``), so list bodies stay plain JSON arrays.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse
from ninja import Field, Schema

from accounts.api import ClientError

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
#: Longer than any cursor this module writes (two values), short enough to refuse junk.
MAX_CURSOR_CHARS = 200
INTEGER_FIELDS = frozenset(
    {
        "AutoField",
        "BigAutoField",
        "IntegerField",
        "BigIntegerField",
        "PositiveIntegerField",
        "PositiveBigIntegerField",
    }
)


class PageQuery(Schema):
    """The query parameters of every list: ``?limit=N&cursor=…``."""

    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT, description="rows per page")
    cursor: str | None = Field(
        None,
        max_length=MAX_CURSOR_CHARS,
        description='from the previous page\'s `Link: <…>; rel="next"` header',
    )


class InvalidCursor(ClientError):
    """The cursor is not one this API handed out; start again without it."""

    code = "invalid_cursor"


@dataclass(frozen=True, kw_only=True)
class Page:
    items: list[Any]
    next_cursor: str | None


def _encode_value(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    return value


def _decode_value(model: type[Model], field: str, raw: Any) -> Any:
    """The value of ``field`` that ``raw`` encodes, only if this module would have
    written ``raw`` for it: a value of another type, out of range or not in the
    canonical form (``_encode_value`` of the decoded value is ``raw`` again) is refused."""
    internal = model._meta.get_field(field).get_internal_type()
    value: Any
    try:
        if internal == "DateTimeField" and isinstance(raw, str):
            value = datetime.datetime.fromisoformat(raw)
            # The database hands out UTC; another offset could leave its range (year 0).
            if value.utcoffset() != datetime.timedelta(0):
                raise ValueError
        elif internal == "UUIDField" and isinstance(raw, str):
            value = uuid.UUID(raw)
        elif internal in INTEGER_FIELDS and type(raw) is int and 0 < raw < 2**63:
            value = raw
        else:
            raise InvalidCursor()
    except (TypeError, ValueError, OverflowError):
        raise InvalidCursor() from None
    if _encode_value(value) != raw:
        raise InvalidCursor()
    return value


def encode_cursor(row: Model, order: Sequence[str]) -> str:
    values = [_encode_value(getattr(row, field.lstrip("-"))) for field in order]
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


def decode_cursor(model: type[Model], cursor: str, order: Sequence[str]) -> list[Any]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error):
        raise InvalidCursor() from None
    if not isinstance(raw, list) or len(raw) != len(order):
        raise InvalidCursor()
    return [_decode_value(model, field.lstrip("-"), v) for field, v in zip(order, raw, strict=True)]


def _after(order: Sequence[str], values: Sequence[Any]) -> Q:
    """Rows strictly after ``values`` in ``order``: (a, b) after (x, y) is a ≶ x, or
    a = x and b ≶ y (the comparison per column follows its direction)."""
    condition = Q()
    for position, field in enumerate(order):
        name = field.lstrip("-")
        lookup = "lt" if field.startswith("-") else "gt"
        step = Q(**{f"{name}__{lookup}": values[position]})
        for earlier, value in zip(order[:position], values[:position], strict=True):
            step &= Q(**{earlier.lstrip("-"): value})
        condition |= step
    return condition


def paginate(queryset: QuerySet, *, order: Sequence[str], cursor: str | None, limit: int) -> Page:
    """One page of ``queryset`` in ``order`` (whose last column is unique) after
    ``cursor``; :class:`InvalidCursor` (400) for a cursor this module did not write."""
    queryset = queryset.order_by(*order)
    if cursor:
        queryset = queryset.filter(_after(order, decode_cursor(queryset.model, cursor, order)))
    rows = list(queryset[: limit + 1])
    items = rows[:limit]
    next_cursor = encode_cursor(items[-1], order) if len(rows) > limit else None
    return Page(items=items, next_cursor=next_cursor)


def next_url(request: HttpRequest, cursor: str | None) -> str | None:
    """The URL of the page after ``cursor`` (same path and query, new cursor)."""
    if cursor is None:
        return None
    query = {k: v for k, v in request.GET.items() if k != "cursor"}
    query["cursor"] = cursor
    return f"{request.path}?{urlencode(query)}"


def sub_list_url(request: HttpRequest, name: str, page: Page) -> str | None:
    """For a detail that shows a first page of ``name``: the URL of the rest, a list
    under the detail's own path (None when the first page was all)."""
    if page.next_cursor is None:
        return None
    query = urlencode({"cursor": page.next_cursor, "limit": len(page.items)})
    return f"{request.path.rstrip('/')}/{name}?{query}"


def page_response(
    request: HttpRequest,
    response: HttpResponse,
    queryset: QuerySet,
    *,
    order: Sequence[str],
    query: PageQuery,
) -> list[Any]:
    """One page of ``queryset`` for a list endpoint; the next page's URL goes in the
    ``Link`` header (none on the last page)."""
    page = paginate(queryset, order=order, cursor=query.cursor, limit=query.limit)
    url = next_url(request, page.next_cursor)
    if url is not None:
        response["Link"] = f'<{url}>; rel="next"'
    return page.items
