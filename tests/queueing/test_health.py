"""/healthz, /readyz and manage.py worker_health.

Heartbeats are real rows of ``procrastinate_workers``, aged by back-dating them; the
worker state files are what ``queueing.worker_state`` writes from a worker's own log record.
"""

from __future__ import annotations

import datetime
import logging
import os

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from queueing import worker_state
from queueing.health import migration_leaves, worker_liveness

pytestmark = pytest.mark.django_db


def register_worker(*, age_seconds: float = 0) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_workers (last_heartbeat) "
            "VALUES (now() - make_interval(secs => %s)) RETURNING id",
            [age_seconds],
        )
        return cursor.fetchone()[0]


@pytest.fixture(autouse=True)
def no_workers(db):
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers")


@pytest.fixture
def state_dir(settings, tmp_path):
    settings.WORKER_STATE_DIR = tmp_path / "workers"
    return settings.WORKER_STATE_DIR


def start_record(worker_id: int | None, action: str = "start_worker") -> logging.LogRecord:
    record = logging.LogRecord("procrastinate.worker", logging.INFO, __file__, 1, "", (), None)
    record.action = action
    record.worker = {"name": "worker", "worker_id": worker_id, "job_id": None, "queues": []}
    return record


def test_healthz_needs_nothing(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "alive"}


def test_head_answers_as_get_does_without_a_body(client):
    """Load balancers probe with HEAD: the same status and headers as GET, no body."""
    response = client.head("/healthz")
    assert response.status_code == 200
    assert response.content == b""
    response = client.head("/readyz")  # no worker: not ready
    assert response.status_code == 503
    assert response["Retry-After"]
    assert response.content == b""
    register_worker(age_seconds=1)
    assert client.head("/readyz").status_code == 200


def test_readyz_is_ready_with_a_fresh_heartbeat(client):
    register_worker(age_seconds=3)
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "ready"
    assert {name: check["ok"] for name, check in body["checks"].items()} == {
        "database": True,
        "migrations": True,
        "worker": True,
    }


def test_readyz_without_a_worker_is_not_ready(client):
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response["Retry-After"]
    body = response.json()
    assert body["status"] == "not_ready"
    assert body["checks"]["worker"] == {"ok": False, "detail": "no worker is registered"}
    assert body["checks"]["database"]["ok"] is True


def test_readyz_with_only_a_stale_heartbeat_is_not_ready(client, settings):
    register_worker(age_seconds=settings.QUEUEING_STALLED_WORKER_SECONDS + 5)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert "threshold" in response.json()["checks"]["worker"]["detail"]


def test_worker_liveness_follows_the_newest_heartbeat(settings, django_assert_num_queries):
    threshold = settings.QUEUEING_STALLED_WORKER_SECONDS
    with django_assert_num_queries(1):
        nobody = worker_liveness()
    assert (nobody.alive, nobody.last_heartbeat, nobody.age) == (False, None, None)

    register_worker(age_seconds=threshold + 5)
    stale = worker_liveness()
    assert not stale.alive
    assert stale.age.total_seconds() >= threshold + 5

    register_worker(age_seconds=1)
    assert worker_liveness().alive


def test_readyz_notices_an_unapplied_migration(client):
    register_worker()
    app, name = migration_leaves()[0].split(".", 1)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_migrations WHERE app = %s AND name = %s", [app, name])
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"] == {
        "ok": False,
        "detail": "1 app(s) behind: run manage.py migrate",
    }


@pytest.mark.django_db(transaction=True)
def test_readyz_is_one_query(client, clean_queue, django_assert_num_queries):
    """In autocommit, as in production (inside a test's transaction it adds a savepoint)."""
    register_worker()
    with django_assert_num_queries(1):
        assert client.get("/readyz").status_code == 200


def test_worker_state_follows_the_worker_log(state_dir):
    handler = worker_state.WorkerStateHandler()
    handler.handle(start_record(41))
    recorded = list(worker_state.recorded_workers())
    assert [(w.pid, w.worker_id) for w in recorded] == [(os.getpid(), 41)]
    handler.handle(start_record(None, action="stop_worker"))
    assert list(worker_state.recorded_workers()) == []


def test_worker_state_skips_a_reused_pid(state_dir):
    worker_state.WorkerStateHandler().handle(start_record(7))
    path = state_dir / f"{os.getpid()}.json"
    path.write_text(path.read_text().replace('"started": "', '"started": "1'))
    assert list(worker_state.recorded_workers()) == []


def test_worker_health_passes_for_a_beating_local_worker(state_dir, capsys):
    worker_state.WorkerStateHandler().handle(start_record(register_worker(age_seconds=2)))
    call_command("worker_health")
    assert "yes" in capsys.readouterr().out


def test_worker_health_fails_for_a_silent_local_worker(state_dir, settings):
    age = settings.QUEUEING_STALLED_WORKER_SECONDS + 1
    worker_state.WorkerStateHandler().handle(start_record(register_worker(age_seconds=age)))
    with pytest.raises(CommandError, match="did not heart-beat within"):
        call_command("worker_health")
    call_command("worker_health", max_age=age + 60)


def test_worker_health_fails_for_a_worker_the_database_forgot(state_dir):
    worker_state.WorkerStateHandler().handle(start_record(987654))
    with pytest.raises(CommandError, match="1 of 1 local worker"):
        call_command("worker_health")


def test_worker_health_fails_without_a_local_worker(state_dir):
    register_worker()
    with pytest.raises(CommandError, match="no worker runs on this host"):
        call_command("worker_health")


@pytest.mark.parametrize(
    "max_age", [0, -1, "nan", "inf", "-inf", "1e308", float("nan"), 10**400, "x", "", None]
)
def test_worker_health_refuses_a_bad_max_age(state_dir, max_age):
    """Called as a command would be (the parser) and from code (call_command's keyword):
    a clear error either way, never a traceback."""
    if max_age is None:
        with pytest.raises(CommandError, match="max-age"):
            call_command("worker_health", "--max-age")
        return
    with pytest.raises(CommandError, match="max-age"):
        call_command("worker_health", f"--max-age={max_age}")
    with pytest.raises(CommandError, match="max-age"):
        call_command("worker_health", max_age=max_age)


def test_a_heartbeat_row_is_what_a_real_worker_writes():
    """The back-dated rows above have the shape procrastinate's own registration gives."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT procrastinate_register_worker_v1()")
        (worker_id,) = cursor.fetchone()
        cursor.execute(
            "SELECT last_heartbeat FROM procrastinate_workers WHERE id = %s", [worker_id]
        )
        (beat,) = cursor.fetchone()
    assert datetime.datetime.now(datetime.UTC) - beat < datetime.timedelta(minutes=1)
