"""Keyed advisory locks: the only module that issues ``pg_advisory_*``.

Every lock is transaction-level (``pg_advisory_xact_lock``): PostgreSQL releases it when
the transaction ends, so a crashed request can never leak one, and it works behind
PgBouncer in transaction mode. Its 64-bit id is ``hashtextextended(namespace || ':' ||
key, 0)``, built in SQL in one place; namespaces are declared once as constants, so two
features can never share (or split) a key space by accident.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connections

from queueing import sql
from queueing.exceptions import DuplicateNamespace, LockOutsideTransaction, UnknownNamespace
from queueing.keys import validate_part
from queueing.sql import queries

__all__ = ["namespace", "try_xact_lock", "xact_lock"]

_declared: dict[str, Namespace] = {}


@dataclass(frozen=True)
class Namespace:
    name: str

    def __str__(self) -> str:
        return self.name


def namespace(name: str) -> Namespace:
    """Declare a lock namespace (once per process; a second declaration raises)."""
    validate_part("namespace", name)
    if name in _declared:
        raise DuplicateNamespace(f"lock namespace {name!r} is declared twice")
    _declared[name] = Namespace(name)
    return _declared[name]


def declared_namespaces() -> tuple[str, ...]:
    return tuple(sorted(_declared))


def _check(ns: Namespace, using: str) -> None:
    if _declared.get(ns.name) is not ns:
        raise UnknownNamespace(f"lock namespace {ns.name!r} was not declared")
    if not connections[using].in_atomic_block:
        raise LockOutsideTransaction()


def xact_lock(ns: Namespace, key: str | int, *, using: str = "default") -> None:
    """Block until this transaction holds the lock on ``(ns, key)``; released at commit
    or rollback. Refuses to run outside ``transaction.atomic()``."""
    _check(ns, using)
    # A statement cursor: when the lock opens the transaction, BEGIN travels with it.
    with sql.statement_cursor(connections[using]) as cursor:
        cursor.execute(queries["advisory_xact_lock"], {"namespace": ns.name, "key": str(key)})


def xact_lock_statement(ns: Namespace, key: str | int) -> tuple[str, dict[str, str]]:
    """The statement (and its parameters) that takes the lock on ``(ns, key)``, for a
    caller that sends it in a pipeline inside a transaction block it opened itself (BEGIN
    and COMMIT in the same pipeline: ``SerialQueue.admit``), where :func:`xact_lock`'s
    check of Django's transaction state does not apply."""
    if _declared.get(ns.name) is not ns:
        raise UnknownNamespace(f"lock namespace {ns.name!r} was not declared")
    return queries["advisory_xact_lock"], {"namespace": ns.name, "key": str(key)}


def try_xact_lock(ns: Namespace, key: str | int, *, using: str = "default") -> bool:
    """Take the lock on ``(ns, key)`` if free, without waiting; True when taken."""
    _check(ns, using)
    with sql.statement_cursor(connections[using]) as cursor:
        cursor.execute(queries["try_advisory_xact_lock"], {"namespace": ns.name, "key": str(key)})
        return bool(cursor.fetchone()[0])
