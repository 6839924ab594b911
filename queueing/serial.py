"""A per-key serial admission queue over any model with (key, status, created) columns.

*Admit* inserts the row with a status decided in the INSERT itself under the key's
advisory lock: ``start`` (e.g. ``pending``) when no first-pass sibling is active or
queued, else ``queued`` — a late admit never jumps the queue; when the slot is free but
older rows wait (it was freed without a promotion: a crash, an operator), the oldest is
promoted in the same statement. *Promote* moves the oldest ``queued`` row to ``start`` under the
same lock, only when no sibling is active. Rows with a parent (e.g. delta re-checks) bypass
the queue: they are born ``start`` and never block it. Two admitters or promoters on the
same key serialise on the lock, across processes and hosts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from typing import Any

from django.db import connections, models, transaction
from psycopg import sql as psql

from queueing import locks, sql
from queueing.enqueue import Policy, job_params, queueing_lock_prefix
from queueing.keys import KeyFormat
from queueing.rows import concrete_field, model_defaults

__all__ = ["Admitted", "SerialQueue"]


@dataclass(frozen=True, kw_only=True)
class Admitted:
    id: int
    status: str
    #: An older queued row this admission started (the slot was free, rows waited).
    promoted: int | None = None
    #: 1-based place among the key's queued rows (0 when not queued).
    position: int = 0
    #: The values of the caller's ``report``.
    report: tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Refused:
    """The guard refused: nothing was written. ``report``: the caller's ``report`` values,
    read under the lock in the refusing statement (which check failed)."""

    report: tuple[Any, ...] = ()


@dataclass(frozen=True, kw_only=True)
class StartJob:
    """The job each row gets when it starts (born ``start``, or promoted), enqueued by the
    admission's own statement: ``task`` with ``args`` plus the row's id under ``id_arg``,
    keyed by ``key`` (a format whose last part is the row's id; ``leading``: its other
    parts) under ``policy``. The same columns as ``queueing.enqueue.enqueue`` writes."""

    task: str
    id_arg: str
    args: Mapping[str, Any] = field(default_factory=dict)
    key: KeyFormat | None = None
    leading: Mapping[str, Any] = field(default_factory=dict)
    policy: Policy = Policy.NONE
    queue: str | None = None

    def params(self) -> dict[str, Any]:
        job = job_params(self.task, args=dict(self.args), queue=self.queue)
        return {
            "job_queue": job["queue"],
            "job_task_name": job["task_name"],
            "job_priority": job["priority"],
            "job_args": job["args"],
            "job_id_arg": self.id_arg,
            "job_lock_prefix": (
                queueing_lock_prefix(self.key, self.policy, **self.leading)
                if self.key is not None
                else None
            ),
        }


#: Sent ahead of the key's lock in an admission's own transaction, where the statement is
#: prepared. PostgreSQL plans a prepared statement afresh, with its values, at each of its
#: first five runs on a connection, and plans each run after the key's lock is granted:
#: about 1 ms of the lock's holding time in each of a connection's first admits (twice
#: the statement's own run). The admit reads the key's rows by index whatever the values,
#: as a caller's blocks should read what they check (they run under the lock too), so
#: the generic plan, made once per connection, is as good.
_GENERIC_PLAN = "SET LOCAL plan_cache_mode = force_generic_plan"


def _fragments(*parts: str | psql.Composable | None) -> psql.Composable:
    """``, a, b`` for the parts given (nothing when none): a caller's optional SQL."""
    given = [psql.SQL(p) if isinstance(p, str) else p for p in parts if p]
    if not given:
        return psql.SQL("")
    return psql.Composed([psql.SQL(", "), psql.SQL(", ").join(given)])


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
        return concrete_field(self.model, name).column

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
        before: str | None = None,
        computed: Mapping[str, str] | None = None,
        report: str | None = None,
        start_job: StartJob | None = None,
    ) -> Admitted | Refused:
        """Insert a row for ``key`` born ``start`` or ``queued``, decided atomically under
        the key's lock (joins the caller's transaction, or opens one), in one statement;
        when the slot is free but older rows wait, the oldest is promoted in it too.

        One round trip: the lock, the statement and (in a transaction of its own) the
        COMMIT go to the server together, in one write (``queueing.sql.held_pipeline``), so
        the key's lock is held for the server's time only, never across a network wait or
        the client's time between two statements. The statement runs after the
        lock, so its snapshot sees every row the lock's previous holder committed.

        The caller may check and write in that same statement, with ``params``: ``before``
        (SQL CTEs ahead of the INSERT, which may read ``siblings``), ``guard`` (a SQL
        condition, which may read them: false inserts nothing), ``computed`` (field → SQL
        value, e.g. the id of a row a ``before`` CTE created), ``then`` (SQL CTEs over the
        inserted row, ``admitted``) and ``report`` (SQL values returned either way, e.g.
        which check refused). All are named SQL blocks, never built from values.
        ``start_job`` enqueues each row that starts (born ``start``, or promoted) in the
        same statement. A false guard returns :class:`Refused` and leaves nothing.

        A child row (its parent field set) is born ``start`` and never takes the slot; it
        still waits for the key's lock when the caller checks or writes, since what they
        read and write is the key's."""
        meta = self.model._meta
        connection = connections[self.using]
        computed = {meta.get_field(name).name: expr for name, expr in (computed or {}).items()}
        values = {meta.get_field(name).name: value for name, value in values.items()}
        values = {**model_defaults(self.model, exclude={*values, *computed}), **values}
        values[self.key_field] = key
        decided_in_sql = {self.status_field, self.created_field, self.updated_field}
        fields = [concrete_field(self.model, name) for name in values if name not in decided_in_sql]
        names = tuple(f"v{i}" for i in range(len(fields)))
        computed_fields = [concrete_field(self.model, name) for name in computed]
        statement = self._admit_statement(
            columns=tuple(f.column for f in fields),
            names=names,
            guard=guard,
            before=before,
            computed_columns=tuple(f.column for f in computed_fields),
            computed=tuple(computed.values()),
            then=then,
            report=report,
            start_job=start_job is not None,
        )
        all_params = {**(params or {}), **self._params(key)}
        all_params.update(
            {
                n: f.get_db_prep_save(values[f.name], connection)
                for n, f in zip(names, fields, strict=True)
            }
        )
        if start_job is not None:
            all_params.update(start_job.params())
        is_child = values.get(self.parent_field) is not None
        all_params["is_child"] = is_child
        if is_child:
            # A child never waits and never takes the slot (siblings count only with
            # parent IS NULL): it is born with the start status.
            all_params["queued"] = self.start
        # The lock serialises what the statement decides: the slot, and whatever the
        # caller's SQL reads and writes (a balance and its charge are per key for a
        # child too). Only a child with none decides nothing that can race.
        needs_lock = not is_child or any((guard, then, before, computed, start_job))
        lock = locks.xact_lock_statement(self.namespace, key) if needs_lock else None
        pk, status, waiting, promoted, *reported = self._run_pipelined(lock, statement, all_params)
        if pk is None:
            return Refused(report=tuple(reported))
        if is_child or status != self.queued:
            return Admitted(id=pk, status=status, report=tuple(reported))
        # FIFO: every row that waited is older; one of them may have just started.
        return Admitted(
            id=pk,
            status=status,
            promoted=promoted,
            position=waiting + 1 - bool(promoted),
            report=tuple(reported),
        )

    @cache  # noqa: B019 (a few queues, each with a few shapes of admission, live forever)
    def _admit_statement(
        self,
        *,
        columns: tuple[str, ...],
        names: tuple[str, ...],
        guard: str | None,
        before: str | None,
        computed_columns: tuple[str, ...],
        computed: tuple[str, ...],
        then: str | None,
        report: str | None,
        start_job: bool,
    ) -> str:
        """The admit statement of one shape of admission (its columns and the caller's
        named SQL blocks), rendered once per process."""
        return sql.render(
            sql.queries["serial_admit"],
            columns=columns,
            placeholders=sql.placeholders(names),
            guard=psql.SQL(guard or "true"),
            before=_fragments(before),
            computed_columns=_fragments(*(psql.Identifier(c) for c in computed_columns)),
            computed=_fragments(*computed),
            then=_fragments(then),
            report=_fragments(report),
            start_job=psql.SQL(
                sql.render(sql.queries["serial_admit_start_job"], **self._identifiers)
                if start_job
                else ""
            ),
            **self._identifiers,
        )

    def _run_pipelined(
        self,
        lock: tuple[str, dict[str, str]] | None,
        statement: str,
        params: dict[str, Any],
    ) -> tuple[Any, ...]:
        """Send the lock and the statement in one pipeline, and wait once for the row.

        Outside a transaction, the pipeline is ``BEGIN; lock; statement; COMMIT``: one
        round trip, and the key's lock is held for the server's time only; a prepared
        statement runs on its generic plan there (:data:`_GENERIC_PLAN`, sent after the
        BEGIN), so the server never plans it under the lock after the connection's first
        admit. Inside the caller's transaction (or with Django's autocommit off), it is
        ``lock; statement`` (the caller commits). When the
        statement fails, the server skips the rest (the COMMIT too) and the block is
        rolled back here before the error propagates; a block refused because the
        statement's prepared plan went stale (``queueing.sql.plan_went_stale``) runs
        again, once."""
        connection = connections[self.using]
        connection.ensure_connection()
        own = not connection.in_atomic_block and connection.get_autocommit()
        prepared = sql.prepares(connection)
        statement_cursor = sql.preparing_cursor(connection) if prepared else connection.cursor()
        with connection.cursor() as cursor, statement_cursor:
            # Bind the parameters before the pipeline opens. The pipeline sends its
            # statements together when it ends (queueing.sql.held_pipeline), but where
            # psycopg lacks what that needs each execute is sent at once, and the server
            # would take the lock while the statement's parameters (the document, its
            # sources) were still being bound here, for client time. A prepared statement is
            # bound on the server instead: the client only encodes its parameters, and the
            # server no longer parses and plans the statement under the lock (its larger
            # cost: 1.3 of 2.3 ms).
            mogrify = getattr(cursor.cursor, "mogrify", None)
            bound: tuple[str, dict[str, Any] | None] = (statement, params)
            if mogrify is not None:
                with connection.wrap_database_errors:
                    if not prepared:
                        bound = (mogrify(statement, params), None)
                    if lock is not None:
                        lock = (mogrify(*lock), {})
            for attempt in (1, 2):
                try:
                    # Errors surface at an execute or at the pipeline's end: Django's
                    # either way. Inside the caller's transaction, not yet begun, its
                    # BEGIN travels in the same pipeline.
                    # Outside one, the pipeline is a transaction of its own: BEGIN, the
                    # block, COMMIT (queueing.sql.committed).
                    with sql.pipelined(connection):
                        if own and prepared:
                            cursor.execute(_GENERIC_PLAN)
                        if lock is not None:
                            cursor.execute(lock[0], lock[1] or None)
                        statement_cursor.execute(*bound)
                except BaseException as exc:
                    if own and attempt == 1 and sql.plan_went_stale(exc):
                        # Refused before it ran (a migration changed what it returns):
                        # the block was rolled back whole (sql.committed, with psycopg's
                        # rollback, which forgets its prepared statements), so it runs
                        # again, once.
                        continue
                    raise
                return statement_cursor.fetchone()
            raise AssertionError("unreachable")

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
