"""Workers ride out the database going away: terminated connections, a restart, a long
stop — on a private PostgreSQL the test starts, stops and cuts off.

Fault model (each cell a test below):

- PostgreSQL terminates the worker's connections (pool, LISTEN, the job threads' Django
  connections), again and again while jobs flow:
  test_terminated_connections_lose_and_repeat_nothing
- PostgreSQL restarts (fast shutdown) while a job runs and jobs wait; then it stays down
  for 30 s and comes back: test_a_database_restart_loses_and_repeats_nothing — the worker
  keeps its pid, LISTEN comes back (jobs enqueued afterwards start although the polling
  fallback is an hour), the running job is retried once through the normal path.
- PostgreSQL stays away past the outage window:
  test_a_worker_exits_non_zero_when_the_database_stays_away
- PostgreSQL stays away long enough for procrastinate's pool to back off (its reconnect
  delay doubles: 1, 2, 4, 8, 16 s …) and returns between two of its attempts, while a job
  runs: test_after_an_outage_a_live_worker_beats_and_fetches_at_once — the worker beats
  again within one heartbeat interval of the database's return (before, it stayed silent
  until the pool's next attempt: recovery took its running job back, and with the outage
  window shorter than that attempt, the worker exited although the database was back),
  and fetches a job enqueued at the return within LISTEN latency and a second (before,
  at the pool's next attempt).
- Outages that end right at the window, one after another with a gap of about a second:
  test_an_outage_ending_at_the_window_never_stops_a_worker_whose_database_is_back (before
  the fix: a loop that made no attempt in a gap counted both outages as one streak, and
  the worker stopped while its other loops worked).
- PostgreSQL ends every pooled connection of a worker whose own connections (LISTEN, the
  heartbeat) live on — a worker whose pool connected before a restart and whose own
  connections after it, as one started during a rolling deploy does:
  test_a_worker_whose_pooled_connections_all_died_fetches_at_once (before the fix: the
  pool slept 1, 2, 2 s between its dead connections, the fetch failed after the 5 s pool
  timeout, and the job waited some 6 s).
- PostgreSQL kills fetches again and again while a backlog never empties:
  test_killed_fetches_over_a_backlog_never_slow_or_stop_the_worker — each fault costs one
  short pause (before, the failure streak ended only on a fetch that found no job: the
  pauses grew to their cap, and once the streak outlasted the outage window the worker
  stopped although its database answered).
"""

from __future__ import annotations

import datetime
import re
import threading
import time
from pathlib import Path

import pytest

from tests.acceptance.private_pg import PrivateServer, private_server
from tests.conftest import wait_for
from tests.invariants import ALWAYS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("private_pg"), pytest.mark.django_db]

WORKER_APP = "pgstage-worker"
EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS test_effects (
    id bigserial PRIMARY KEY, label text NOT NULL, at timestamptz NOT NULL DEFAULT now())"""


@pytest.fixture(scope="module")
def pg() -> PrivateServer:
    with private_server() as server:
        server.migrate()
        with server.connect() as conn:
            conn.execute(EFFECTS_DDL)
        yield server


@pytest.fixture
def db(pg: PrivateServer):
    """A fresh queue on the private server, and a connection the storms leave alone."""
    with pg.connect(application_name="pgstage-test") as conn:
        conn.execute(
            "TRUNCATE test_effects, procrastinate_events, procrastinate_periodic_defers, "
            "procrastinate_jobs, procrastinate_workers RESTART IDENTITY CASCADE"
        )
    yield pg


def worker_env(pg: PrivateServer, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": pg.url,
        "PGAPPNAME": WORKER_APP,
        "PGSTAGE_TASK_MODULES": "tests.queueing.tasks",
        "WORKER_HEARTBEAT_SECONDS": "1",
        "STALLED_WORKER_SECONDS": "5",
        "STALLED_RECOVERY_SECONDS": "1.2",
        **extra,
    }


def defer(pg: PrivateServer, labels: list[str], task: str = "tests.record") -> None:
    with pg.connect(application_name="pgstage-test") as conn:
        conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
            "SELECT 'default', %s, jsonb_build_object('label', l) FROM unnest(%s::text[]) l",
            [task, labels],
        )


def query(pg: PrivateServer, sql: str, params=None) -> list[tuple]:
    for attempt in range(50):
        try:
            with pg.connect(application_name="pgstage-test") as conn:
                return conn.execute(sql, params).fetchall()
        except Exception:
            if attempt == 49:
                raise
            time.sleep(0.2)
    return []


#: How long a long job waits for its release file before it gives up: past every wait
#: of a test that holds it (a restart, a 30 s outage and their recoveries, each waited
#: for up to 60 s), so that a slow machine fails the test's own wait, not the job.
LONG_JOB_SECONDS = 300


def defer_long(pg: PrivateServer, task: str, release: Path) -> None:
    """One job labelled ``long`` of ``task``, which runs until ``release`` exists."""
    with pg.connect(application_name="pgstage-test") as conn:
        conn.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, args) VALUES "
            "('default', %s, jsonb_build_object('label', 'long', 'release_file', %s::text,"
            " 'timeout', %s::float8))",
            [task, str(release), LONG_JOB_SECONDS],
        )


def statuses(pg: PrivateServer, task: str = "tests.record") -> dict[str, int]:
    rows = query(
        pg,
        "SELECT status::text, count(*) FROM procrastinate_jobs WHERE task_name = %s GROUP BY 1",
        [task],
    )
    return dict(rows)


def effect_counts(pg: PrivateServer) -> dict[str, int]:
    return dict(query(pg, "SELECT label, count(*) FROM test_effects GROUP BY 1"))


def reruns(pg: PrivateServer) -> int:
    """Jobs that started more than once (a retry after their connection died under them,
    or a requeue of a fetch whose reply was lost)."""
    return query(
        pg,
        "SELECT count(*) FROM (SELECT job_id FROM procrastinate_events WHERE type = 'started' "
        "GROUP BY job_id HAVING count(*) > 1) AS rerun",
    )[0][0]


def assert_settled(pg: PrivateServer) -> None:
    """Every invariant holds, and no job but the framework's own ticks waits or runs."""
    found = {name: rows for name, sql in ALWAYS.items() if (rows := query(pg, sql))}
    assert not found, f"invariants violated: {found}"
    left = query(
        pg,
        "SELECT id, task_name, status::text FROM procrastinate_jobs "
        "WHERE status IN ('todo', 'doing') AND task_name NOT LIKE 'queueing.sweep%'",
    )
    assert left == [], f"jobs left waiting or running: {left}"


def test_terminated_connections_lose_and_repeat_nothing(db, start_worker):
    # Polling once an hour: only LISTEN, established again after each cut, starts jobs.
    worker = start_worker(env=worker_env(db, WORKER_POLLING_SECONDS="3600"), concurrency=2)
    pid = worker.process.pid
    stop = threading.Event()
    terminated = []

    def storm() -> None:
        while not stop.is_set():
            terminated.append(db.terminate(WORKER_APP))
            stop.wait(0.25)

    storm_thread = threading.Thread(target=storm)
    storm_thread.start()
    labels = [f"job-{i}" for i in range(500)]
    try:
        for start in range(0, 500, 25):  # 500 jobs over the 10 s storm
            defer(db, labels[start : start + 25])
            time.sleep(0.5)
    finally:
        stop.set()
        storm_thread.join(timeout=10)
    storm_over = time.monotonic()
    assert sum(terminated) > 20, "the storm did not hit the worker's connections"

    wait_for(
        lambda: statuses(db) == {"succeeded": 500},
        timeout=120,
        message=f"every job to succeed ({statuses(db)})\n{worker.log()[-3000:]}",
    )
    assert worker.alive and worker.process.pid == pid
    counts = effect_counts(db)
    assert set(counts) == set(labels)
    assert_settled(db)
    print(
        f"\n{sum(terminated)} connections terminated; 500 jobs, 0 lost, "
        f"{reruns(db)} re-run, {sum(c - 1 for c in counts.values())} duplicate effects; "
        f"all done {time.monotonic() - storm_over:.1f} s after the storm"
    )


def test_a_database_restart_loses_and_repeats_nothing(db, start_worker, tmp_path):
    # Polling once an hour: only LISTEN, established again after each outage, can start
    # the jobs enqueued after it.
    worker = start_worker(env=worker_env(db, WORKER_POLLING_SECONDS="3600"), concurrency=2)
    pid = worker.process.pid
    release = tmp_path / "release"
    defer_long(db, "tests.block", release)
    defer(db, [f"before-{i}" for i in range(50)])
    wait_for(lambda: "long:started" in effect_counts(db), message="the long job to start")

    db.restart()  # fast shutdown: every session is terminated mid-run
    restarted = time.monotonic()
    defer(db, [f"after-restart-{i}" for i in range(50)])
    wait_for(
        lambda: statuses(db).get("succeeded", 0) == 100,
        timeout=60,
        message=f"jobs after the restart ({statuses(db)})\n{worker.log()[-3000:]}",
    )
    restart_seconds = time.monotonic() - restarted

    db.stop()
    time.sleep(30)  # the outage itself: 30 s without a database
    db.start()
    returned = time.monotonic()
    defer(db, [f"after-outage-{i}" for i in range(50)])
    wait_for(
        lambda: statuses(db).get("succeeded", 0) == 150,
        timeout=60,
        message=f"jobs after the outage ({statuses(db)})\n{worker.log()[-3000:]}",
    )
    recovery_seconds = time.monotonic() - returned

    release.touch()
    wait_for(
        lambda: statuses(db, "tests.block") == {"succeeded": 1},
        timeout=60,
        message=f"the long job ({statuses(db, 'tests.block')})\n{worker.log()[-3000:]}",
    )
    assert worker.alive and worker.process.pid == pid
    assert "next attempt in" in worker.log()
    # Each loop's failure is one line of its own: procrastinate's abort poll logged each
    # at ERROR with its traceback, every interval of the outage, while the long job ran.
    assert "poll_jobs_to_abort error" not in worker.log()
    counts = effect_counts(db)
    assert all(counts.get(f"{p}-{i}") for p in ("before", "after-restart") for i in range(50))
    # The long job's connection died under it: it failed once, was retried through the
    # normal path, and finished once.
    assert counts["long:finished"] == 1
    assert_settled(db)
    print(
        f"\nrestart: 50 jobs done {restart_seconds:.1f} s after it; 30 s stop: 50 jobs "
        f"done {recovery_seconds:.1f} s after the server returned; 0 lost, "
        f"{reruns(db)} re-run"
    )


def test_a_worker_exits_non_zero_when_the_database_stays_away(db, start_worker):
    worker = start_worker(env=worker_env(db, DATABASE_OUTAGE_SECONDS="4"))
    db.stop()
    stopped = time.monotonic()
    try:
        assert worker.wait(timeout=60) != 0
        exited = time.monotonic() - stopped
    finally:
        db.start()
    print(f"\nexited {exited:.1f} s after the server stopped (window 4 s)")
    log = worker.log()
    assert "the database stayed unreachable while" in log
    assert "QUEUEING_DATABASE_OUTAGE_SECONDS" in log


def server_epoch(pg: PrivateServer, sql: str, params=None) -> float | None:
    [(value,)] = query(pg, f"SELECT extract(epoch FROM ({sql}))::float8", params)
    return value


def test_after_an_outage_a_live_worker_beats_and_fetches_at_once(db, start_worker, tmp_path):
    # Beat every second, dead after 5 s of silence; the outage window (25 s) is longer
    # than the outage, and shorter than the pool's first attempt after it (31 s).
    env = worker_env(db, WORKER_POLLING_SECONDS="3600", DATABASE_OUTAGE_SECONDS="25")
    worker = start_worker(env=env, concurrency=2)
    pid = worker.process.pid
    release = tmp_path / "release"
    defer_long(db, "tests.outlast", release)
    wait_for(lambda: "long:started" in effect_counts(db), message="the long job to start")
    [(job_id, worker_id)] = query(
        db, "SELECT id, worker_id FROM procrastinate_jobs WHERE task_name = 'tests.outlast'"
    )

    db.stop()
    # The pool found its connections dead at once, and tries them again 1, 3, 7, 15 and
    # 31 s later: the database returns between the last two.
    time.sleep(17)
    db.start()
    back = server_epoch(db, "pg_postmaster_start_time()")
    defer(db, ["after-return"])
    wait_for(
        lambda: (
            server_epoch(
                db, "SELECT last_heartbeat FROM procrastinate_workers WHERE id = %s", [worker_id]
            )
            > back
        ),
        timeout=30,
        message=f"the first beat after the return\n{worker.log()[-3000:]}",
    )
    first_beat = server_epoch(
        db, "SELECT last_heartbeat FROM procrastinate_workers WHERE id = %s", [worker_id]
    )
    wait_for(
        lambda: effect_counts(db).get("after-return"),
        timeout=60,
        message=f"the job enqueued at the return\n{worker.log()[-3000:]}",
    )
    event_at = (
        "SELECT e.at FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
        "WHERE e.type = %s AND j.args->>'label' = 'after-return'"
    )
    fetched = server_epoch(db, event_at, ["started"])
    deferred = server_epoch(db, event_at, ["deferred"])
    # Recovery has run for well over the stall threshold since the return.
    time.sleep(6)
    release.touch()
    wait_for(
        lambda: statuses(db, "tests.outlast") == {"succeeded": 1} or not worker.alive,
        timeout=60,
        message=f"the long job ({statuses(db, 'tests.outlast')})\n{worker.log()[-3000:]}",
    )
    assert worker.alive and worker.process.pid == pid, worker.log()[-3000:]
    stalls = query(db, "SELECT stalls FROM pgstage_job_stalls WHERE job_id = %s", [job_id])
    assert stalls == [], f"recovery took the live worker's job: {stalls}\n{worker.log()[-3000:]}"
    counts = effect_counts(db)
    assert (counts["long:started"], counts["long:finished"]) == (1, 1)
    beat_delay, fetch_delay = first_beat - back, fetched - back
    # The guarantee is LISTEN latency plus a second (the beat: one heartbeat interval,
    # 1 s here, proven above by the job's stall count); the pool's own next attempt would
    # have come some 12 s after the return. The margin is for a loaded machine.
    assert fetch_delay < 5, f"fetching resumed {fetch_delay:.1f} s after the return"
    assert_settled(db)
    print(
        f"\n17 s outage: first beat {beat_delay:.2f} s after the database accepted "
        f"connections again, first job fetched {fetch_delay:.2f} s after it "
        f"({fetched - deferred:.2f} s after it was enqueued); 0 stalls"
    )


KILL_EVERY_TENTH_FETCH = """
CREATE SEQUENCE IF NOT EXISTS test_fetches;
CREATE OR REPLACE FUNCTION test_kill_every_tenth_fetch() RETURNS trigger AS $$
BEGIN
    IF nextval('test_fetches') % 10 = 0 THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER test_kill_every_tenth_fetch
    BEFORE UPDATE OF status ON procrastinate_jobs FOR EACH ROW
    WHEN (OLD.status = 'todo' AND NEW.status = 'doing')
    EXECUTE FUNCTION test_kill_every_tenth_fetch()"""


def test_killed_fetches_over_a_backlog_never_slow_or_stop_the_worker(db, start_worker):
    with db.connect(application_name="pgstage-test") as conn:
        conn.execute(KILL_EVERY_TENTH_FETCH)
    try:
        labels = [f"b-{i}" for i in range(600)]
        defer(db, labels)  # a backlog: every fetch between the faults finds a job
        # An outage window far shorter than the storm: only failure streaks that end at
        # each successful fetch keep the worker running.
        worker = start_worker(env=worker_env(db, DATABASE_OUTAGE_SECONDS="3"), concurrency=2)
        wait_for(
            lambda: statuses(db) == {"succeeded": 600} or not worker.alive,
            timeout=180,
            message=f"the backlog ({statuses(db)})\n{worker.log()[-3000:]}",
        )
        assert worker.alive, worker.log()[-3000:]
    finally:
        with db.connect(application_name="pgstage-test") as conn:
            conn.execute("DROP TRIGGER test_kill_every_tenth_fetch ON procrastinate_jobs")
    log = worker.log()
    attempts = [int(n) for n in re.findall(r"while fetching jobs \(attempt (\d+)", log)]
    assert len(attempts) >= 30, f"the fetches were not killed\n{log[-3000:]}"
    assert set(attempts) == {1}, f"a streak outlived a successful fetch: {attempts}"
    assert set(effect_counts(db)) == set(labels)
    assert_settled(db)
    print(f"\n{len(attempts)} fetches killed over a 600-job backlog; every pause the first")


def _stopped_at(log: str) -> float | None:
    """When the worker decided to stop (its log's clock, UTC epoch), if it did."""
    match = re.search(r"^(\S+ \S+) ERROR queueing.worker: stopping the worker", log, re.M)
    if match is None:
        return None
    stamp = datetime.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.replace(tzinfo=datetime.UTC).timestamp()


def test_an_outage_ending_at_the_window_never_stops_a_worker_whose_database_is_back(
    db, start_worker
):
    # Outages that end around the window: the database accepts connections again just
    # before a loop's failure streak reaches it. Whatever a loop's attempt in flight then
    # says, the worker must not stop once its database answers.
    window = 4.0
    env = worker_env(db, DATABASE_OUTAGE_SECONDS=str(window), WORKER_POLLING_SECONDS="0.5")
    worker = start_worker(env=env, concurrency=2)
    rounds: list[tuple[float, float]] = []
    for early in (0.9, 0.6, 0.3, 0.6, 0.3):
        down = time.time()
        db.stop()
        time.sleep(max(0.0, down + window - early - time.time()))
        db.start()
        rounds.append((down, time.time()))
        label = f"after-{len(rounds)}"
        defer(db, [label])
        wait_for(
            lambda label=label: effect_counts(db).get(label) or not worker.alive,
            timeout=30,
            message=f"the job after outage {len(rounds)}\n{worker.log()[-3000:]}",
        )
        if not worker.alive:
            break
    lasted = [round(back - down, 2) for down, back in rounds]
    stopped = _stopped_at(worker.log())
    if stopped is not None:
        # Allowed only while an outage had lasted the whole window (the server took longer
        # to start than planned): after it began, before the server was back.
        down, back = max((r for r in rounds if r[0] <= stopped), default=rounds[0])
        assert window <= stopped - down and stopped < back, (
            f"stopped {stopped - down:.2f} s into an outage of {back - down:.2f} s (outages "
            f"{lasted} s, window {window} s)\n{worker.log()[-4000:]}"
        )
        return
    print(f"\noutages of {lasted} s (window {window} s): never stopped")


def test_a_worker_whose_pooled_connections_all_died_fetches_at_once(db, start_worker):
    # Polling once an hour: the job starts on its notification, through the pool.
    worker = start_worker(env=worker_env(db, WORKER_POLLING_SECONDS="3600"))
    defer(db, ["warm-up"])
    wait_for(lambda: effect_counts(db).get("warm-up"), message="the first job")
    # The heartbeat has its connection (it beat), LISTEN has its own: end every other one.
    wait_for(
        lambda: query(
            db,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s AND query LIKE %s",
            [WORKER_APP, "%last_heartbeat = now()%"],
        )[0][0],
        message="the first beat",
    )
    ended = [
        pid
        for (pid,) in query(
            db,
            "WITH pooled AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
            "WHERE application_name = %s AND NOT ("
            "query LIKE 'LISTEN%%' OR query = 'SELECT 1' OR query LIKE %s)) "
            "SELECT pid FROM pooled WHERE pg_terminate_backend(pid)",
            [WORKER_APP, "%last_heartbeat = now()%"],
        )
    ]
    assert len(ended) >= 4, ended  # the pool's connections, at least
    wait_for(
        lambda: not query(db, "SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [ended]),
        message="the pooled connections to end",
    )
    before = len(worker.log())
    defer(db, ["after-the-end"])
    wait_for(
        lambda: effect_counts(db).get("after-the-end"),
        message=f"the job deferred after\n{worker.log()[-3000:]}",
    )
    # It was fetched on the first attempt: the pool lent a live connection at once
    # (before, the fetch waited out the pool's 5 s timeout and failed).
    assert "while fetching jobs" not in worker.log()[before:], worker.log()[before:]
    event_at = (
        "SELECT e.at FROM procrastinate_events e JOIN procrastinate_jobs j ON j.id = e.job_id "
        "WHERE e.type = %s AND j.args->>'label' = 'after-the-end'"
    )
    started, deferred = (server_epoch(db, event_at, [kind]) for kind in ("started", "deferred"))
    print(f"\n{len(ended)} connections ended: the job started {started - deferred:.2f} s after")
    assert worker.alive
