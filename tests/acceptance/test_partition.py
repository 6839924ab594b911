"""A partition of one worker's connections (half-open: nothing is forwarded, nothing is
closed), on a private PostgreSQL behind the nemesis proxy (tests/nemesis/proxy.py).

Fault model — worker A's every connection (pool, LISTEN, heartbeat, Django's) goes
through a proxy that is partitioned while A and B each run a long job:
- A's heartbeat is in flight or next due on a connection that will never answer: it must
  notice within its bound (each beat is bounded by the heartbeat interval, at least a
  second; a new connection through the partition is bounded the same way), not wait for
  the link to heal (TCP keepalives and ``tcp_user_timeout`` see nothing: the proxy's
  kernel acknowledges every byte);
- B's heartbeat gets through: recovery must never take B's job;
- A looks dead: recovery must take A's job back only once A has been silent for the whole
  stall threshold, and A's late outcome after the heal must not overwrite the new run's.
test_a_partitioned_worker_notices_and_only_its_job_is_taken_after_the_threshold covers all.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.acceptance.private_pg import PrivateServer, private_server
from tests.acceptance.test_database_outage import EFFECTS_DDL, effect_counts, query
from tests.conftest import wait_for
from tests.nemesis.proxy import Proxy, ProxyLoop
from tests.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("private_pg"), pytest.mark.django_db]

HEARTBEAT = 1.0
THRESHOLD = 5
SWEEP_TIMEOUT = 3


@pytest.fixture(scope="module")
def pg() -> PrivateServer:
    with private_server(port=free_port()) as server:
        server.migrate()
        with server.connect() as conn:
            conn.execute(EFFECTS_DDL)
        yield server


@pytest.fixture
def proxy(pg: PrivateServer):
    loop = ProxyLoop()
    proxy = Proxy(loop, upstream_port=pg.port, name="worker-a")
    proxy.start()
    yield proxy
    proxy.close()
    loop.stop()


def _env(url: str, name: str) -> dict[str, str]:
    return {
        "DATABASE_URL": url,
        "PGAPPNAME": name,
        "PGSTAGE_TASK_MODULES": "tests.queueing.tasks",
        "WORKER_HEARTBEAT_SECONDS": str(HEARTBEAT),
        "STALLED_WORKER_SECONDS": str(THRESHOLD),
        "STALLED_RECOVERY_SECONDS": "1.2",
        "WORKER_POLLING_SECONDS": "0.5",
        # A partition can cut A inside stalled recovery, holding its try-lock: the server
        # ends that session's transaction after this long (docs/reliability.md).
        "SWEEP_TRANSACTION_TIMEOUT_SECONDS": str(SWEEP_TIMEOUT),
    }


def _defer_long(pg: PrivateServer, label: str, release: Path) -> int:
    with pg.connect(application_name="pgstage-test") as conn:
        [(job_id,)] = conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) VALUES ('default',"
            " 'tests.outlast', jsonb_build_object('label', %s::text, 'release_file', %s::text))"
            " RETURNING id",
            [label, str(release)],
        ).fetchall()
    return job_id


def _holder(pg: PrivateServer, job_id: int) -> tuple[str, int | None]:
    [(status, worker_id)] = query(
        pg, "SELECT status::text, worker_id FROM procrastinate_jobs WHERE id = %s", [job_id]
    )
    return status, worker_id


def test_a_partitioned_worker_notices_and_only_its_job_is_taken_after_the_threshold(
    pg, proxy, start_worker, tmp_path
):
    with pg.connect(application_name="pgstage-test") as conn:
        conn.execute(
            "TRUNCATE test_effects, procrastinate_events, procrastinate_periodic_defers, "
            "procrastinate_jobs, procrastinate_workers RESTART IDENTITY CASCADE"
        )
    through_proxy = pg.url.replace(f":{pg.port}/", f":{proxy.port}/")
    release = tmp_path / "release"
    worker_a = start_worker(env=_env(through_proxy, "worker-a"), name="a")
    job_a = _defer_long(pg, "a", release)
    wait_for(lambda: "a:started" in effect_counts(pg), message="A's job")
    worker_b = start_worker(env=_env(pg.url, "worker-b"), name="b", concurrency=2)
    job_b = _defer_long(pg, "b", release)
    wait_for(lambda: "b:started" in effect_counts(pg), message="B's job")
    a_id, b_id = _holder(pg, job_a)[1], _holder(pg, job_b)[1]
    assert a_id != b_id

    proxy.partition()
    partitioned = time.monotonic()
    # A's heartbeat notices: its beat (or the connection it opens next) times out.
    wait_for(
        lambda: "while beating" in worker_a.log(),
        # Its next beat (within an interval) times out after its bound (1 s); before the
        # fix, psycopg's cancel request and wait (5 s each) came first.
        timeout=HEARTBEAT + 1 + 4,
        message=f"A's heartbeat to notice\n{worker_a.log()[-2000:]}",
    )
    noticed = time.monotonic() - partitioned
    # Recovery (B's) takes A's job back, and only once A was silent for the threshold.
    silence_at_recovery = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        [(holder, silence)] = query(
            pg,
            "SELECT j.worker_id, extract(epoch FROM now() - w.last_heartbeat)"
            " FROM procrastinate_jobs j, procrastinate_workers w"
            " WHERE j.id = %s AND w.id = %s",
            [job_a, a_id],
        )
        if holder != a_id:
            silence_at_recovery = float(silence)
            break
        assert _holder(pg, job_b) == ("doing", b_id), "recovery took the live worker's job"
        time.sleep(0.1)
    assert silence_at_recovery is not None, worker_b.log()[-2000:]
    assert silence_at_recovery >= THRESHOLD
    wait_for(lambda: effect_counts(pg).get("a:started") == 2, message="A's job runs again")
    assert _holder(pg, job_b) == ("doing", b_id)
    assert query(pg, "SELECT job_id FROM pgstage_job_stalls") == [(job_a,)]

    proxy.heal()
    release.touch()
    wait_for(
        lambda: _holder(pg, job_a)[0] == _holder(pg, job_b)[0] == "succeeded",
        timeout=60,
        message=f"both jobs\n{worker_a.log()[-2000:]}",
    )
    # A's first run ended after the heal: its outcome was not this worker's to save.
    wait_for(lambda: effect_counts(pg).get("a:finished") == 2, timeout=60, message="A's run")
    assert effect_counts(pg)["b:finished"] == 1
    assert worker_a.alive and worker_b.alive
    print(
        f"\npartition: A's heartbeat noticed after {noticed:.1f} s (heartbeat {HEARTBEAT} s);"
        f" its job was taken after {silence_at_recovery:.1f} s of silence (threshold"
        f" {THRESHOLD} s); B's job untouched"
    )
