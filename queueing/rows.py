"""Row helpers that stay correct under retries and concurrent writers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.core.exceptions import FieldDoesNotExist
from django.db import connections, models, transaction
from django.utils import timezone

from queueing import sql
from queueing.exceptions import RowVanished

__all__ = ["insert_or_get", "replace_children"]

M = TypeVar("M", bound=models.Model)


def replace_children(
    model: type[M],
    *,
    parent: Mapping[str, Any],
    rows: Iterable[M],
    using: str = "default",
    savepoint: bool = True,
) -> list[M]:
    """Replace every ``model`` row matching ``parent`` with ``rows``: DELETE, then INSERT,
    in one transaction.

    A retry never trips the children's own unique key (the old rows are gone first), and a
    failure before or during the transaction leaves the old rows intact. Inside a caller's
    transaction, ``savepoint=False`` spares the savepoint's two round trips: a failure then
    fails the caller's transaction as a whole (which keeps the old rows just the same),
    for a caller that does not carry on after an error.
    """
    rows = list(rows)
    for row in rows:
        for field, value in parent.items():
            setattr(row, field, value)
    with transaction.atomic(using=using, savepoint=savepoint):
        model._default_manager.using(using).filter(**parent).delete()
        return model._default_manager.using(using).bulk_create(rows)


def concrete_field(model: type[models.Model], name: str) -> models.Field:
    """``model``'s field ``name``, which must have a column of its own (not a reverse
    relation, a many-to-many or a generic foreign key)."""
    field = model._meta.get_field(name)
    if not isinstance(field, models.Field) or not field.concrete:
        raise FieldDoesNotExist(f"{model.__name__}.{name} has no column of its own")
    return field


def model_defaults(model: type[models.Model], *, exclude: Iterable[str]) -> dict[str, Any]:
    """Python-side defaults (``default=``, ``auto_now(_add)``) for fields not given, as the
    ORM would fill them on ``create()``."""
    now = timezone.now()
    out: dict[str, Any] = {}
    for field in model._meta.concrete_fields:
        if field.primary_key or field.name in exclude:
            continue
        if getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False):
            out[field.name] = now
        elif field.has_default():
            out[field.name] = field.get_default()
    return out


def insert_or_get(
    model: type[models.Model],
    *,
    values: Mapping[str, Any],
    conflict_fields: tuple[str, ...],
    using: str = "default",
) -> tuple[int, bool]:
    """Insert a row or find the one that holds its unique key; return ``(id, created)``.

    ``INSERT … ON CONFLICT (conflict_fields) DO NOTHING RETURNING id``; on a conflict the
    existing id is looked up by the same key, and :class:`RowVanished` is raised if it is
    gone — so an audit entry that follows always names the row that is in the table.
    """
    meta = model._meta
    connection = connections[using]
    values = {**model_defaults(model, exclude=values.keys()), **values}
    fields = [concrete_field(model, name) for name in values]
    conflict = [concrete_field(model, name).column for name in conflict_fields]
    statement = sql.render(
        "INSERT INTO {table} ({columns}) VALUES ({values}) "
        "ON CONFLICT ({conflict}) DO NOTHING RETURNING {pk}",
        table=meta.db_table,
        columns=tuple(f.column for f in fields),
        values=sql.placeholders(tuple(f"v{i}" for i in range(len(fields)))),
        conflict=tuple(conflict),
        pk=meta.pk.column,
    )
    params = {f"v{i}": f.get_db_prep_save(values[f.name], connection) for i, f in enumerate(fields)}
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        row = cursor.fetchone()
    if row is not None:
        return row[0], True
    lookup = {name: values[name] for name in conflict_fields}
    existing = (
        model._default_manager.using(using).filter(**lookup).values_list("pk", flat=True).first()
    )
    if existing is None:
        raise RowVanished(f"{model.__name__} with {lookup} conflicted but cannot be found")
    return existing, False
