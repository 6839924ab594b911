"""The reliability scenario: both domains under real workers, one of them SIGKILLed
mid-flight and another SIGTERMed, then recovery; every invariant of docs/design.md is asserted
while work is in flight and once it has settled.

Time is moved by back-dating rows (heartbeats, leases, grace windows), never by sleeping.
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from accounts.services import tenant_get_or_create, user_get_or_create
from pipeline.submit import Upload, anfrage_submit
from queueing.sweeps import run_sweep
from runs.admission import analysis_job_admit
from runs.credits import credit_grant
from tests.conftest import wait_for
from tests.invariants import assert_invariants, assert_live, violations

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

INQUIRY = b"12 pcs steel beam HEA 200, 6 m\n4 Stk Stahltraeger IPE 300, 4500 mm\n"
DOC = "<p>Steel carries load [1]. Coatings extend life [2].</p>"
SOURCES = [
    {"key": "1", "title": "Steel", "doi": "10.1000/steel.1", "text": "Steel carries load."},
    {"key": "2", "title": "Coatings", "doi": "10.1000/coat.2", "text": "Coatings extend life."},
]


def execute(sql: str, params=()) -> None:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def count(sql: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchone()[0]


def unfinished_jobs() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing') "
            "AND task_name NOT LIKE 'queueing.sweep%%'"
        )
        return cursor.fetchone()[0]


def test_kill_and_drain_workers_mid_flight_then_every_invariant_holds(clean_queue, start_worker):
    acme, globex = tenant_get_or_create(slug="acme"), tenant_get_or_create(slug="globex")
    users = [
        user_get_or_create(tenant=acme, username="alice"),
        user_get_or_create(tenant=globex, username="carol"),
    ]
    for user in users:
        credit_grant(user_id=user.id, amount=6)

    doomed = start_worker("--concurrency=2", name="doomed")
    drained = start_worker("--concurrency=2", name="drained")

    for n in range(6):
        anfrage_submit(
            tenant=acme if n % 2 else globex,
            actor="test",
            uploads=[Upload(filename=f"inquiry-{n}.txt", data=INQUIRY)],
        )
    for n in range(5):
        for user in users:
            analysis_job_admit(user=user, title=f"paper {n}", doc_html=DOC, sources=SOURCES)
    assert_invariants()

    # Kill one worker with whatever it holds; drain the other (it finishes its jobs).
    wait_for(
        lambda: (
            count("SELECT count(*) FROM pipeline_runs WHERE status = 'success'") >= 6
            and count("SELECT count(*) FROM procrastinate_jobs WHERE status = 'doing'") >= 2
        ),
        timeout=30,
        interval=0.01,
        message="work in flight",
    )
    doomed.signal(signal.SIGKILL)
    drained.signal(signal.SIGTERM)
    assert drained.wait(timeout=60) == 0, drained.log()
    doomed.wait(timeout=10)
    assert_invariants()

    # Recovery: the dead worker's heartbeat and its stage leases are in the past.
    execute("UPDATE procrastinate_workers SET last_heartbeat = now() - interval '10 minutes'")
    execute(
        "UPDATE pipeline_runs SET lease_expires_at = now() - interval '1 second' "
        "WHERE status = 'running'"
    )
    recovered = run_sweep("stalled_jobs")
    rescuer = start_worker("--concurrency=4", name="rescuer")

    def settled() -> bool:
        if unfinished_jobs():
            return False
        # Nobody saves from a browser here: let the grace window pass, rescue the runs.
        execute(
            "UPDATE analysis_jobs SET updated_at = now() - interval '1 hour' "
            "WHERE status IN ('complete', 'failed')"
        )
        run_sweep("unsaved_runs", batch_size=1000)
        run_sweep("analysis_resume")
        return not unfinished_jobs() and not violations(settled=True)

    wait_for(
        settled,
        timeout=90,
        interval=0.5,
        message=f"settling\n{violations(settled=True)}\n{rescuer.log()[-3000:]}",
    )
    assert_invariants(settled=True)
    assert_live()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pipeline_runs WHERE status = 'success'")
        assert cursor.fetchone()[0] == 6 * 4
        cursor.execute("SELECT status, count(*) FROM analysis_jobs GROUP BY 1")
        assert dict(cursor.fetchall()) == {"complete": 10}
        cursor.execute("SELECT count(*) FROM analysis_runs")
        assert cursor.fetchone()[0] == 10
    print(f"stalled-work recovery: {recovered}")
