"""Health endpoints for load balancers and orchestrators, and the worker's own probe.

* ``GET /healthz`` — liveness: the process answers. Touches nothing else, so a database
  outage never gets web processes restarted (it makes them *unready*, below).
* ``GET /readyz`` — readiness: the database answers, every migration the code knows is
  applied, and at least one worker heart-beat within the stall threshold
  (``STALLED_WORKER_SECONDS``). One SQL round trip, no lock, nothing written; ``200`` when
  all hold, else ``503`` with ``Retry-After``, and each check says what it saw.
* :func:`worker_liveness` — whether any worker heart-beat within the stall threshold, for
  a page that tells its users that queued work waits for a worker.
* :func:`local_worker_health` — what ``manage.py worker_health`` reports for the workers
  started on this host (their ids are recorded by :mod:`queueing.worker_state`).

Neither endpoint needs a login: they reveal no data, only up or down. Both answer ``HEAD``
as well (load balancers probe with it): the same status and headers, no body.
"""

from __future__ import annotations

import datetime
import os
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.migrations.loader import MigrationLoader
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from queueing import worker_state
from queueing.middleware import RETRY_AFTER_SECONDS
from queueing.sql import load

__all__ = ["Check", "WorkerLiveness", "healthz_view", "readiness", "readyz_view", "worker_liveness"]

queries = load("queueing", "health.sql")


@dataclass(frozen=True, kw_only=True)
class Check:
    name: str
    ok: bool
    detail: str


@cache
def migration_leaves() -> tuple[str, ...]:
    """``app.name`` of the latest migration of every app, read from disk once per process
    (the code does not change under a running process)."""
    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    return tuple(sorted(f"{app}.{name}" for app, name in graph.leaf_nodes()))


def stall_threshold() -> datetime.timedelta:
    return datetime.timedelta(seconds=int(getattr(settings, "QUEUEING_STALLED_WORKER_SECONDS", 30)))


def _seconds(delta: datetime.timedelta) -> str:
    return f"{max(delta.total_seconds(), 0):.0f} s"


def readiness() -> list[Check]:
    """The three readiness checks, from one statement."""
    leaves = migration_leaves()
    try:
        # A savepoint only inside a transaction (a test's): in autocommit, as in
        # production, the check stays one round trip.
        guard = transaction.atomic() if connection.in_atomic_block else nullcontext()
        with guard, connection.cursor() as cursor:
            cursor.execute(queries["readiness"], {"leaves": list(leaves)})
            applied, last_heartbeat, now = cursor.fetchone()
    except DatabaseError as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        missing_schema = getattr(exc.__cause__, "sqlstate", None) == "42P01"
        return [
            Check(
                name="database",
                ok=missing_schema,
                detail="answers" if missing_schema else f"unreachable: {first_line}",
            ),
            Check(
                name="migrations",
                ok=False,
                detail="tables missing: run manage.py migrate" if missing_schema else "unknown",
            ),
            Check(name="worker", ok=False, detail="unknown"),
        ]
    checks = [
        Check(name="database", ok=True, detail="answers"),
        Check(
            name="migrations",
            ok=applied == len(leaves),
            detail=(
                "applied"
                if applied == len(leaves)
                else f"{len(leaves) - applied} app(s) behind: run manage.py migrate"
            ),
        ),
    ]
    threshold = stall_threshold()
    if last_heartbeat is None:
        checks.append(Check(name="worker", ok=False, detail="no worker is registered"))
    else:
        age = now - last_heartbeat
        checks.append(
            Check(
                name="worker",
                ok=age <= threshold,
                detail=f"last heartbeat {_seconds(age)} ago (threshold {_seconds(threshold)})",
            )
        )
    return checks


# Outside ATOMIC_REQUESTS' transaction, which would connect before the view runs: the
# liveness answer needs no database, and readiness reports an unreachable one itself.
@transaction.non_atomic_requests
@never_cache
@require_safe
def healthz_view(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "alive"})


@transaction.non_atomic_requests
@never_cache
@require_safe
def readyz_view(request: HttpRequest) -> JsonResponse:
    checks = readiness()
    ready = all(c.ok for c in checks)
    response = JsonResponse(
        {
            "status": "ready" if ready else "not_ready",
            "checks": {c.name: {"ok": c.ok, "detail": c.detail} for c in checks},
        },
        status=200 if ready else 503,
    )
    if not ready:
        response["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return response


@dataclass(frozen=True, kw_only=True)
class WorkerLiveness:
    """The newest heartbeat of any worker (None: none is registered), its age by the
    database's clock, and the stall threshold it is judged by."""

    last_heartbeat: datetime.datetime | None
    age: datetime.timedelta | None
    threshold: datetime.timedelta

    @property
    def alive(self) -> bool:
        return self.age is not None and self.age <= self.threshold


def worker_liveness() -> WorkerLiveness:
    """Whether any worker heart-beat within ``QUEUEING_STALLED_WORKER_SECONDS``: the
    readiness check's worker test on its own. One read of ``procrastinate_workers``
    (an index probe), no lock, nothing written."""
    with connection.cursor() as cursor:
        cursor.execute(queries["last_heartbeat"])
        last_heartbeat, now = cursor.fetchone()
    return WorkerLiveness(
        last_heartbeat=last_heartbeat,
        age=None if last_heartbeat is None else now - last_heartbeat,
        threshold=stall_threshold(),
    )


@dataclass(frozen=True, kw_only=True)
class WorkerBeat:
    pid: int
    worker_id: int
    age: datetime.timedelta | None
    slots: int | None = None
    hung_slots: int = 0

    @property
    def all_slots_hung(self) -> bool:
        """Every slot holds a run past its timeout (``queueing.timeouts``): the worker
        beats but runs nothing until it is restarted."""
        return self.slots is not None and self.slots > 0 and self.hung_slots >= self.slots

    def healthy(self, threshold: datetime.timedelta) -> bool:
        return self.age is not None and self.age <= threshold and not self.all_slots_hung


def local_worker_health() -> list[WorkerBeat]:
    """The heartbeat age of every worker process alive on this host (``age`` None: the
    database no longer lists it — it unregistered, or was pruned as stalled)."""
    local = [w for w in worker_state.recorded_workers() if _alive(w.pid)]
    if not local:
        return []
    with connection.cursor() as cursor:
        cursor.execute(queries["worker_heartbeats"], {"worker_ids": [w.worker_id for w in local]})
        rows = {row[0]: row for row in cursor.fetchall()}
    beats = []
    for w in local:
        row = rows.get(w.worker_id)
        beats.append(
            WorkerBeat(
                pid=w.pid,
                worker_id=w.worker_id,
                age=row[2] if row else None,
                slots=row[3] if row else None,
                hung_slots=row[4] if row else 0,
            )
        )
    return beats


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
