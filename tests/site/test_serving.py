"""The production web server (gunicorn, as ``make run`` and the container run it) under
a burst of admissions, directly and behind PgBouncer in transaction mode.

Fault model: more clients than threads arrive at once → they wait in the listen backlog,
none is reset (``test_a_50_client_burst_of_admits_gets_no_connection_error``); more
threads than server connections, each transaction possibly on another server connection
(PgBouncer's transaction mode) → the per-user advisory lock, the admission's INSERT and
the transactional enqueue still decide correctly: one pending job per user, every job
charged once, one process_job per started job, and a real worker (on a session
connection) runs them all (``test_admits_locks_and_enqueues_through_pgbouncer``).
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import pytest
from django.db import connection

from accounts.services import api_token_create
from runs.credits import credit_grant
from runs.models import AnalysisJob, CreditEntry, JobStatus
from tests.conftest import database_url, jobs, wait_for
from tests.factories import TenantFactory, UserFactory
from tests.invariants import assert_invariants
from tests.runs.factories import payload
from tests.servers import PgBouncer, http, pgbouncer_binary, start_web

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CLIENTS = 50


def burst(url: str, tokens: list[str]) -> list[object]:
    """POST one admission per token, all released at once; each result is the reply or
    the exception the client got (a reset connection, a timeout)."""
    barrier = threading.Barrier(len(tokens))
    results: list[object] = [None] * len(tokens)

    def client(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = http(
                "POST",
                f"{url}/api/analysis-jobs",
                body=payload(title=f"burst {index}"),
                headers={"Authorization": f"Bearer {tokens[index]}"},
                timeout=120,
            )
        except Exception as exc:
            results[index] = exc

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(tokens))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    return results


def users_with_tokens(count: int, *, credits: int) -> list[tuple[object, str]]:
    tenant = TenantFactory(slug="burst")
    made = []
    for n in range(count):
        user = UserFactory(username=f"burst{n}", tenant=tenant)
        credit_grant(user_id=user.pk, amount=credits, note="burst")
        made.append((user, api_token_create(user=user, name="burst")))
    return made


def assert_admitted(results: list[object], users: list) -> None:
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], f"{len(errors)} client(s) failed: {errors[:3]}"
    assert Counter(r.status for r in results) == {201: len(results)}, [
        r.body[:200] for r in results if r.status != 201
    ]
    per_user = len(results) // len(users)
    for user, _ in users:
        statuses = Counter(AnalysisJob.objects.filter(user=user).values_list("status", flat=True))
        # Nothing ran yet: exactly one job took the user's slot, the rest wait in order.
        assert statuses == {JobStatus.PENDING: 1, JobStatus.QUEUED: per_user - 1}, statuses
    assert CreditEntry.objects.filter(kind="charge").count() == len(results)
    pending = set(AnalysisJob.objects.filter(status="pending").values_list("pk", flat=True))
    enqueued = [j["args"]["job_id"] for j in jobs(task_name="runs.process_job")]
    assert sorted(enqueued) == sorted(pending), "one process_job per started job, no more"
    assert_invariants()


def test_a_50_client_burst_of_admits_gets_no_connection_error(clean_queue, tmp_path):
    users = users_with_tokens(10, credits=CLIENTS // 10)
    tokens = [token for _, token in users for _ in range(CLIENTS // 10)]
    env = {**os.environ, "DATABASE_URL": database_url()}
    # The defaults of make run: 2 processes, 4 threads each, so 42 clients wait their turn.
    web = start_web(env, tmp_path / "web.log")
    try:
        results = burst(web.url, tokens)
    finally:
        web.stop()
    assert_admitted(results, users)


def test_admits_locks_and_enqueues_through_pgbouncer(clean_queue, tmp_path, start_worker):
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip("PgBouncer is not installed and cannot be (not root, or no apt-get)")
    # On TCP (DATABASE_URL) or the embedded server's Unix socket alike.
    info = connection.connection.info
    bouncer = PgBouncer(
        binary=binary, server_host=info.host, server_port=info.port, dbname=info.dbname
    )
    users = users_with_tokens(5, credits=CLIENTS // 5)
    tokens = [token for _, token in users for _ in range(CLIENTS // 5)]
    env = {
        **os.environ,
        "DATABASE_URL": bouncer.url(),
        "DATABASE_TRANSACTION_POOLING": "true",
    }
    web = start_web(env, tmp_path / "web.log", WEB_WORKERS=2, WEB_THREADS=8)
    try:
        results = burst(web.url, tokens)
        servers = bouncer.show("SERVERS")
        listed = http(
            "GET",
            f"{web.url}/api/analysis-jobs?limit=200",
            headers={"Authorization": f"Bearer {tokens[0]}"},
        )
    finally:
        web.stop()
        stats = bouncer.show("STATS")
        bouncer.stop()
    assert_admitted(results, users)
    # 16 web threads shared at most 3 server connections, transaction by transaction.
    assert 0 < len(servers) <= bouncer.pool_size
    assert sum(row["total_xact_count"] for row in stats if row["database"] == info.dbname) > 100
    assert listed.status == 200 and len(listed.json()) == CLIENTS // 5

    # A worker on a session connection (LISTEN) runs what was enqueued through PgBouncer,
    # and every user's queue drains in order.
    start_worker(concurrency=4)
    wait_for(
        lambda: not AnalysisJob.objects.exclude(status=JobStatus.COMPLETE).exists(),
        timeout=120,
        message="every admitted analysis to complete",
    )
    assert_invariants()
