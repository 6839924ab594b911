"""What the scenarios share: the run's context, bench tenants and users, sessions released
together in threads, and a thread whose database session goes through a counter."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections

from accounts.models import Tenant, User
from accounts.services import tenant_get_or_create, user_get_or_create
from bench import database
from bench.harness import Sizes
from bench.wire import WireCounter

T = TypeVar("T")

#: A document with two citations and its sources: what the admission checks accept.
DOC_HTML = (
    "<h1>Thesis</h1>"
    "<p>Water boils at one hundred degrees at sea level [thermo]. "
    "The moon is made of green cheese [moon].</p>"
)
SOURCES = [
    {
        "key": "thermo",
        "title": "Thermodynamics",
        "doi": "10.1000/thermo.1",
        "text": "At sea level water boils at one hundred degrees.",
    },
    {"key": "moon", "title": "Lunar geology", "doi": None, "text": "The moon is rock and dust."},
]


@dataclass(frozen=True, kw_only=True)
class Context:
    sizes: Sizes
    #: The server the harness is connected to (psycopg parameters).
    params: dict[str, Any]
    database_url: str
    server: database.Server
    log_dir: Path
    #: The harness's own ``application_name`` (PGAPPNAME), which its sessions carry.
    application: str


def bench_tenant(name: str) -> Tenant:
    return tenant_get_or_create(slug=f"{database.TENANT_PREFIX}{name}-{uuid.uuid4().hex[:8]}")


def admit(user: User) -> None:
    """One admission, as ``POST /api/analysis-jobs`` runs it."""
    from runs.admission import analysis_job_admit

    analysis_job_admit(user=user, title="bench", doc_html=DOC_HTML, sources=SOURCES)


def funded_users(tenant: Tenant, count: int, *, credits: int) -> list[User]:
    from runs.credits import credit_grant

    users = []
    for index in range(count):
        user = user_get_or_create(tenant=tenant, username=f"{tenant.slug}-{index}")
        credit_grant(user_id=user.pk, amount=credits, note="bench")
        users.append(user)
    return users


@dataclass(frozen=True)
class Released:
    """What threads released together did: each call's seconds, and the wall time from
    the release to the last return."""

    latencies: list[float]
    wall: float


def released_together(
    work: Callable[[Any], object],
    plans: Sequence[Sequence[Any]],
    *,
    warm_up: Callable[[int], object] | None = None,
    on_release: Callable[[], object] | None = None,
) -> Released:
    """One thread per plan, each with its own database session opened beforehand (and,
    with ``warm_up``, used once by ``warm_up(thread index)``, as a web thread's persistent
    connection has been); all start at one barrier and call ``work(item)`` for each item
    of their plan. ``on_release()`` runs as they start (e.g. a sampler's ``arm``, so that
    it sees the release, not the warm-up)."""
    barrier = threading.Barrier(len(plans) + 1)
    latencies: list[list[float]] = [[] for _ in plans]
    ends = [0.0] * len(plans)
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            connections[DEFAULT_DB_ALIAS].ensure_connection()
            if warm_up is not None:
                warm_up(index)
            barrier.wait(timeout=120)
            for item in plans[index]:
                started = time.perf_counter()
                work(item)
                latencies[index].append(time.perf_counter() - started)
            ends[index] = time.perf_counter()
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(plans))]
    for thread in threads:
        thread.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        barrier.wait(timeout=120)
    released = time.perf_counter()
    if on_release is not None:
        on_release()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return Released(
        latencies=[s for per_thread in latencies for s in per_thread], wall=max(ends) - released
    )


def through(counter: WireCounter, func: Callable[[], T]) -> T:
    """Run ``func`` in a thread whose Django connection goes through ``counter``."""
    outcome: dict[str, Any] = {}

    def body() -> None:
        wrapper = connections[DEFAULT_DB_ALIAS]
        wrapper.settings_dict = {
            **wrapper.settings_dict,
            "HOST": "127.0.0.1",
            "PORT": counter.port,
            "OPTIONS": {
                **wrapper.settings_dict.get("OPTIONS", {}),
                "sslmode": "disable",
                "gssencmode": "disable",
            },
        }
        try:
            wrapper.ensure_connection()
            outcome["value"] = func()
        except BaseException as exc:
            outcome["error"] = exc
        finally:
            wrapper.close()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def counts_text(counts: dict[str, Any]) -> str:
    """``15 round trips: 15 statements (2 transaction control, 13 work) in 1 transaction``."""
    kinds = ", ".join(f"{n:g} {kind}" for kind, n in counts["statements_by_kind"].items())
    return (
        f"{counts['round_trips']:g} round trips: {counts['statements']:g} statements "
        f"({kinds}) in {counts['transactions']:g} transaction(s)"
    )


def top_work(counts: dict[str, Any], n: int = 5, width: int = 70) -> str:
    """The most frequent statements that do work (not BEGIN/COMMIT, not liveness checks)."""
    work = [
        s for s in counts["top_statements"] if s["kind"] == "work" and s["calls_per_unit"] >= 0.5
    ][:n]
    return ", ".join(f"{s['calls_per_unit']:g}x `{s['statement'][:width]}`" for s in work)


def count_label(n: int) -> str:
    """``1M``, ``100k``, ``10k``, ``2,000``: sizes as the table names them."""
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 10_000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return f"{n:,}"
