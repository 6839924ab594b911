"""Named SQL blocks, loaded from ``queueing/sql/*.sql`` (procrastinate's format).

A block starts with ``-- name --`` and a description line. Blocks that name tables or
columns use ``{placeholders}``; :func:`render` fills them with quoted identifiers via
``psycopg.sql``, never with string formatting of values. Every value is a bound parameter.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from psycopg import sql as psql

_BLOCK = re.compile(r"^-- (?P<name>[a-z0-9_]+) --\n(?:--[^\n]*\n)*", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    matches = list(_BLOCK.finditer(text))
    queries = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        queries[match["name"]] = text[match.end() : end].strip()
    return queries


@cache
def load(package: str, filename: str) -> dict[str, str]:
    return parse(resources.files(package).joinpath("sql", filename).read_text())


queries = load("queueing", "queueing.sql")


def _part(value: str | tuple[str, ...] | psql.Composable) -> psql.Composable:
    if isinstance(value, psql.Composable):
        return value
    if isinstance(value, tuple):
        return psql.SQL(", ").join(psql.Identifier(v) for v in value)
    return psql.Identifier(value)


def placeholders(names: tuple[str, ...]) -> psql.Composable:
    """``%(a)s, %(b)s`` for bound parameters named ``names``."""
    return psql.SQL(", ").join(psql.Placeholder(n) for n in names)


def render(template: str, **identifiers: str | tuple[str, ...] | psql.Composable) -> str:
    """Fill ``{name}`` placeholders with quoted identifiers (tuples become lists) or with
    composed fragments such as :func:`placeholders`."""
    parts = {name: _part(value) for name, value in identifiers.items()}
    return psql.SQL(template).format(**parts).as_string(None)
