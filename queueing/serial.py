"""A per-key serial admission queue over any model with (key, status, created) columns.

*Admit* inserts the row with a status decided in the INSERT itself under the key's
advisory lock: ``start`` (e.g. ``pending``) when no first-pass sibling is active or
queued, else ``queued`` — a late admit never jumps the queue; when the slot is free but
older rows wait (it was freed without a promotion: a crash, an operator), the oldest is
promoted in the same transaction. *Promote* moves the oldest ``queued`` row to ``start`` under the
same lock, only when no sibling is active. Rows with a parent (e.g. delta re-checks) bypass
the queue: they are born ``start`` and never block it. Two admitters or promoters on the
same key serialise on the lock, across processes and hosts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.db import connections, models, transaction
from psycopg import sql as psql

from queueing import locks, sql
from queueing.rows import model_defaults


@dataclass(frozen=True, kw_only=True)
class Admitted:
    id: int
    status: str
    #: An older queued row this admission started (the slot was free, rows waited).
    promoted: int | None = None
    #: 1-based place among the key's queued rows (0 when not queued).
    position: int = 0


@dataclass(frozen=True)
class SerialQueue:
    model: type[models.Model]
    namespace: locks.Namespace
    key_field: str
    status_field: str = "status"
    created_field: str = "created_at"
    updated_field: str = "updated_at"
    parent_field: str = "parent_id"
    deleted_field: str | None = None
    queued: str = "queued"
    start: str = "pending"
    active: tuple[str, ...] = ("pending", "running")
    using: str = "default"

    def _column(self, name: str) -> str:
        return self.model._meta.get_field(name).column

    @cached_property
    def _identifiers(self) -> dict[str, str]:
        meta = self.model._meta
        return {
            "table": meta.db_table,
            "pk": meta.pk.column,
            "key": self._column(self.key_field),
            "status": self._column(self.status_field),
            "created": self._column(self.created_field),
            "updated": self._column(self.updated_field),
            "parent": self._column(self.parent_field),
            "deleted": self._column(self.deleted_field or self.parent_field),
        }

    def _params(self, key: Any) -> dict[str, Any]:
        return {
            "key": key,
            "queued": self.queued,
            "start": self.start,
            "active": list(self.active),
            "has_deleted": self.deleted_field is not None,
        }

    def admit(
        self,
        *,
        key: Any,
        values: Mapping[str, Any],
        guard: str | None = None,
        then: str | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> Admitted | None:
        """Insert a row for ``key`` born ``start`` or ``queued``, decided atomically under
        the key's lock (joins the caller's transaction, or opens one), in one statement.

        ``guard`` (a SQL condition) and ``then`` (SQL CTEs over the inserted row,
        ``admitted``) let the caller check and write in that same statement, with
        ``params``; a false guard inserts nothing and returns None. Both are named SQL
        blocks, never built from values. A child row (its parent field set) is born
        ``start`` and never takes the slot; it still waits for the key's lock when a
        guard or ``then`` is given, since what they read and write is the key's."""
        meta = self.model._meta
        connection = connections[self.using]
        values = {meta.get_field(name).name: value for name, value in values.items()}
        values = {**model_defaults(self.model, exclude=values.keys()), **values}
        values[self.key_field] = key
        decided_in_sql = {self.status_field, self.created_field, self.updated_field}
        fields = [meta.get_field(name) for name in values if name not in decided_in_sql]
        names = tuple(f"v{i}" for i in range(len(fields)))
        statement = sql.render(
            sql.queries["serial_admit"],
            columns=tuple(f.column for f in fields),
            placeholders=sql.placeholders(names),
            guard=psql.SQL(guard or "true"),
            then=psql.Composed([psql.SQL(", "), psql.SQL(then)]) if then else psql.SQL(""),
            **self._identifiers,
        )
        all_params = {**(params or {}), **self._params(key)}
        all_params.update(
            {
                n: f.get_db_prep_save(values[f.name], connection)
                for n, f in zip(names, fields, strict=True)
            }
        )
        is_child = values.get(self.parent_field) is not None
        if is_child:
            # A child never waits and never takes the slot (siblings count only with
            # parent IS NULL): it is born with the start status.
            all_params["queued"] = self.start
        # The lock serialises what the statement decides: the slot, and whatever the
        # guard reads and ``then`` writes (a balance and its charge are per key for a
        # child too). Only a child with neither decides nothing that can race.
        needs_lock = not is_child or guard is not None or then is not None
        with transaction.atomic(using=self.using, savepoint=False):
            if needs_lock:
                locks.xact_lock(self.namespace, key, using=self.using)
            with connection.cursor() as cursor:
                cursor.execute(statement, all_params)
                row = cursor.fetchone()
            if row is None:
                return None
            pk, status, waiting, active = row
            if is_child or status != self.queued:
                return Admitted(id=pk, status=status)
            promoted = self._promote_locked(key) if waiting and not active else None
        # FIFO: every row that waited is older; one of them may have just started.
        return Admitted(
            id=pk, status=status, promoted=promoted, position=waiting + 1 - bool(promoted)
        )

    def promote(self, *, key: Any) -> int | None:
        """Under the key's lock, start the oldest queued row if no sibling is active;
        return its id, or None. Idempotent: a second call finds the slot taken."""
        with transaction.atomic(using=self.using):
            locks.xact_lock(self.namespace, key, using=self.using)
            return self._promote_locked(key)

    def _promote_locked(self, key: Any) -> int | None:
        statement = sql.render(sql.queries["serial_promote"], **self._identifiers)
        with connections[self.using].cursor() as cursor:
            cursor.execute(statement, self._params(key))
            row = cursor.fetchone()
        return row[0] if row else None

    def stuck_keys(self, *, limit: int = 500) -> list[Any]:
        """Keys with queued rows and nothing active (read without locks; promote re-checks)."""
        statement = sql.render(sql.queries["serial_stuck_keys"], **self._identifiers)
        params = self._params(None)
        params["limit"] = limit
        with connections[self.using].cursor() as cursor:
            cursor.execute(statement, params)
            return [row[0] for row in cursor.fetchall()]

    def promote_stuck(self, *, limit: int = 500) -> list[int]:
        """Promote for every stuck key; returns the promoted ids."""
        promoted = []
        for key in self.stuck_keys(limit=limit):
            row_id = self.promote(key=key)
            if row_id is not None:
                promoted.append(row_id)
        return promoted

    def position(self, *, key: Any, row_id: int, created: Any) -> int:
        """1-based position of a queued row among the key's queued rows (0 if not queued)."""
        manager = self.model._default_manager.using(self.using)
        filters = {
            self.key_field: key,
            self.status_field: self.queued,
            f"{self.parent_field}__isnull": True,
        }
        if self.deleted_field:
            filters[f"{self.deleted_field}__isnull"] = True
        ahead = manager.filter(**filters).filter(
            models.Q(**{f"{self.created_field}__lt": created})
            | models.Q(**{self.created_field: created, "pk__lt": row_id})
        )
        return ahead.count() + 1
