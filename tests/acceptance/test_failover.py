"""Failover to a standby: the primary crashes in the middle of a run, the standby is promoted,
and work goes on there, with nothing doubled and — with synchronous replication — nothing
committed lost.

The cluster: a primary and a streaming standby (``tests.acceptance.replication``), two
private PostgreSQL servers on 127.0.0.1. Two workers (concurrency 2) and the web (gunicorn)
use the multi-host URL ``postgresql://…@127.0.0.1:p1,127.0.0.1:p2/pgstage?
target_session_attrs=read-write``: nothing is told about the failover, libpq finds the
server that accepts writes.

The run: a feeder defers generic jobs (``tests.failover.effect``, whose runs and effects
are logged to a file, outside the database) and a client submits inquiries through the
API, whose four pipeline stages the workers run. Once both kinds of work run, the primary
stops (``immediate``: a crash, nothing more sent to the standby) and the standby is
promoted; work is offered on until as much again was acknowledged, then everything
acknowledged must be done, once, on the new primary, and every invariant hold there.

The workers run with a short stage lease and retry backoff (``PIPELINE_LEASE_SECONDS``,
``RETRY_*``), so that a stage caught computing by the crash — its failure could not be
recorded — is taken over in seconds rather than after the default 300 s lease.

Fault model (each cell a test below):

- the primary crashes while jobs run, stages compute and the web admits inquiries; until
  the promotion no server accepts writes (the standby refuses: "session is read-only");
  then the standby is the primary, with a synchronous standby's every acknowledged commit:
  test_work_continues_on_the_promoted_standby_with_nothing_doubled_or_lost;
- the same crash with an asynchronous standby, which may lack the last commits the
  primary acknowledged: test_asynchronous_replication_loses_a_tail.

Not covered here: a primary that hangs or is cut off by the network rather than crashing
(half-open connections), and an old primary that comes back as a primary (docs/deploy.md
says to rebuild it as a standby first).

Measured (printed; docs/reliability.md, "Failover"): the time from the promotion to the
first job started on the new primary, and until all work is done; what an asynchronous
standby lost, and its replication lag meanwhile.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from tests.acceptance.failover_tasks import LOG_VARIABLE, TABLE_DDL
from tests.acceptance.replication import ReplicatedPair
from tests.conftest import wait_for
from tests.invariants import ALWAYS, SETTLED
from tests.servers import http, manage, start_web, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("private_pg"),
    pytest.mark.django_db,
    # Two clusters, a migration, gunicorn and two workers: about 50 s measured here (load
    # average 10 on 2 cores), and past the suite's default 120 s on a busier machine.
    pytest.mark.timeout(300),
]

INQUIRY = b"12 pcs steel beam HEA 200, 6 m\n4 Stk Stahltraeger IPE 300, 4500 mm\n"
STAGES = 4
#: Concurrent writers of the asynchronous test.
WRITERS = 4


class Client(threading.Thread):
    """Offers work every ``every`` seconds until stopped, through whatever server the
    multi-host URL finds; ``acked`` is the work whose submission was acknowledged (a list:
    read while the thread appends), ``refused`` counts the submissions that failed (and
    were not repeated)."""

    def __init__(self, every: float) -> None:
        super().__init__(daemon=True)
        self.every = every
        self.stop = threading.Event()
        self.acked: list[str] = []
        self.refused = 0

    def submit(self, n: int) -> str | None:
        """Offer work number ``n``; its key once acknowledged, None when refused."""
        raise NotImplementedError

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                key = self.submit(n)
            except (psycopg.Error, OSError):
                key = None
            if key is None:
                self.refused += 1
            else:
                self.acked.append(key)
            n += 1
            self.stop.wait(self.every)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=30)


class JobFeeder(Client):
    """Defers ``batch`` generic jobs at a time, labelled ``job-<n>-<i>``, in one statement."""

    def __init__(self, url: str, every: float, batch: int) -> None:
        super().__init__(every)
        self.url = url
        self.batch = batch
        self.conn: psycopg.Connection | None = None

    def submit(self, n: int) -> str | None:
        labels = [f"job-{n}-{i}" for i in range(self.batch)]
        try:
            if self.conn is None:
                self.conn = psycopg.connect(self.url, autocommit=True, connect_timeout=2)
            self.conn.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, args) "
                "SELECT 'default', 'tests.failover.effect', jsonb_build_object('label', l) "
                "FROM unnest(%s::text[]) l",
                [labels],
            )
        except psycopg.Error:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            raise
        return f"job-{n}"

    def labels(self) -> set[str]:
        return {f"{key}-{i}" for key in self.acked for i in range(self.batch)}


class InquiryClient(Client):
    """Submits one inquiry at a time through the API (multipart, as a browser would)."""

    def __init__(self, base_url: str, token: str, every: float) -> None:
        super().__init__(every)
        self.base_url = base_url
        self.token = token
        self.statuses: Counter[int] = Counter()

    def submit(self, n: int) -> str | None:
        boundary = uuid.uuid4().hex
        body = (
            (
                f'--{boundary}\r\nContent-Disposition: form-data; name="files"; '
                f'filename="inquiry-{n}.txt"\r\nContent-Type: text/plain\r\n\r\n'
            ).encode()
            + INQUIRY
            + f"\r\n--{boundary}--\r\n".encode()
        )
        request = urllib.request.Request(
            f"{self.base_url}/api/anfragen",
            data=body,
            method="POST",
            headers={
                "Authorization": f"Bearer {self.token}",
                "Content-Type": f"multipart/form-data; boundary={boundary}",
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                self.statuses[response.status] += 1
                return str(json.loads(response.read())["id"])
        except urllib.error.HTTPError as exc:
            self.statuses[exc.code] += 1
            return None


def query(url: str, sql: str, params=None) -> list[tuple]:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def log_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@pytest.fixture
def pair():
    cluster = ReplicatedPair(synchronous=True)
    yield cluster
    cluster.remove()


def test_work_continues_on_the_promoted_standby_with_nothing_doubled_or_lost(
    pair, start_worker, tmp_path
):
    url = pair.url()
    effects_log = tmp_path / "effects.jsonl"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "PGSTAGE_DATA_DIR": str(tmp_path / "data"),  # uploads: the web stores, workers read
        # Every process checks these together (queueing.E003, queueing.E007).
        "STALLED_WORKER_SECONDS": "5",
        "WORKER_HEARTBEAT_SECONDS": "1",
        "STALLED_RECOVERY_SECONDS": "1.2",
    }
    manage("migrate", "--noinput", "-v", "0", env=env)
    query(url, TABLE_DDL)
    token = manage("create_api_token", "--tenant", "acme", "--user", "alice", env=env)
    worker_env = {
        **env,
        "PGSTAGE_TASK_MODULES": "tests.acceptance.failover_tasks",
        LOG_VARIABLE: str(effects_log),
        "PIPELINE_LEASE_SECONDS": "5",
        "RETRY_BASE_SECONDS": "0.5",
        "RETRY_CAP_SECONDS": "2",
    }
    workers = [start_worker(env=worker_env, concurrency=2, wait_ready=False) for _ in range(2)]
    web = start_web(env, tmp_path / "web.log", WEB_WORKERS=1, WEB_THREADS=2)
    pids = [w.process.pid for w in workers]
    feeder = JobFeeder(url, every=0.25, batch=4)
    inquiries = InquiryClient(web.url, token.strip().splitlines()[-1], every=0.5)

    def offered_since(since: tuple[set[str], set[str]], jobs: int, anfragen: int) -> bool:
        return (
            len(set(feeder.acked) - since[0]) >= jobs
            and len(set(inquiries.acked) - since[1]) >= anfragen
        )

    try:
        feeder.start()
        inquiries.start()
        # Work in flight on the primary, of both kinds.
        wait_for(
            lambda: offered_since((set(), set()), 12, 4) and len(log_lines(effects_log)) > 40,
            timeout=60,
            message=f"jobs to run on the primary\n{workers[0].log()[-2000:]}",
        )
        before = set(feeder.acked), set(inquiries.acked)
        crashed = time.time()
        pair.fail_over()
        promoted = time.time()
        # And offered again, now to the new primary.
        wait_for(
            lambda: offered_since(before, 12, 4),
            timeout=60,
            message=f"work to be offered after the failover ({inquiries.statuses})",
        )
    finally:
        feeder.close()
        inquiries.close()
        if feeder.conn is not None:
            feeder.conn.close()
    offered = time.time() - promoted
    new_primary = pair.standby.url("pgstage")

    def done() -> bool:
        effects = {r[0] for r in query(new_primary, "SELECT label FROM failover_effects")}
        stages = query(
            new_primary,
            "SELECT anfrage_id::text FROM pipeline_runs WHERE status = 'success' "
            "GROUP BY 1 HAVING count(*) = %s",
            [STAGES],
        )
        return feeder.labels() <= effects and set(inquiries.acked) <= {r[0] for r in stages}

    wait_for(
        done,
        timeout=60,
        interval=0.2,
        message=f"all acknowledged work to be done\n{workers[0].log()[-3000:]}",
    )
    all_done = time.time()

    # Both workers rode the failover out: same processes, still running.
    assert [w.process.pid for w in workers] == pids
    assert all(w.alive for w in workers), [w.log()[-2000:] for w in workers]
    # The failover happened mid-run: jobs ran on both servers (both kinds of work were
    # acknowledged before and after it: the waits above).
    lines = log_lines(effects_log)
    ports = {line["port"] for line in lines if line["event"] == "start"}
    assert ports == {pair.primary.port, pair.standby.port}

    # Nothing doubled: each effect was made once (a second run found the first's row).
    made = Counter(line["label"] for line in lines if line["event"] == "effect")
    assert [label for label, n in made.items() if n > 1] == []
    # Nothing committed lost: every effect whose commit was acknowledged, every job and
    # every inquiry whose submission was acknowledged, is on the new primary.
    effects = {r[0] for r in query(new_primary, "SELECT label FROM failover_effects")}
    assert set(made) <= effects
    assert feeder.labels() <= effects
    found = {
        name: rows
        for name, sql in {**ALWAYS, **SETTLED}.items()
        if (rows := query(new_primary, sql))
    }
    assert found == {}, f"invariants violated on the new primary: {found}"
    failed = query(
        new_primary, "SELECT id, task_name FROM procrastinate_jobs WHERE status = 'failed'"
    )
    assert failed == []

    # The web found the new primary too.
    wait_until(
        lambda: http("GET", f"{web.url}/readyz").status == 200,
        timeout=30,
        message=lambda: f"/readyz on the new primary: {http('GET', f'{web.url}/readyz').body}",
    )
    assert web.process.poll() is None
    web.stop()

    on_old = [line for line in lines if line["port"] == pair.primary.port]
    cut = {line["label"] for line in on_old if line["event"] == "start"} - {
        line["label"] for line in on_old if line["event"] != "start"
    }
    # Stages claimed more than once: the crash cut their first run (one whose failure it
    # kept from being recorded stayed claimed until its lease ran out).
    (stages_cut,) = query(new_primary, "SELECT count(*) FROM pipeline_runs WHERE attempts > 1")[0]
    first_start = min(
        line["at"]
        for line in lines
        if line["event"] == "start" and line["port"] == pair.standby.port
    )
    print(
        f"\nfailover (synchronous standby): crash to promotion {promoted - crashed:.2f} s; "
        f"first job started on the new primary {first_start - promoted:.2f} s after the "
        f"promotion; all work done {all_done - promoted:.1f} s after it (work offered for "
        f"{offered:.1f} s after it); {len(cut)} generic jobs and {stages_cut} stages (lease "
        f"{worker_env['PIPELINE_LEASE_SECONDS']} s) claimed again after the crash; "
        f"{len(feeder.labels())} jobs and {len(inquiries.acked)} inquiries acknowledged, 0 "
        f"lost, 0 doubled; {sum(line['event'] == 'again' for line in lines)} runs found "
        f"their effect already made; refused around the failover: {feeder.refused} job "
        f"batches, {inquiries.refused} inquiries (HTTP {dict(inquiries.statuses)})"
    )


class Writer(threading.Thread):
    """Commits rows ``(writer, 1)``, ``(writer, 2)``… one transaction each, as fast as the
    primary acknowledges them, until its connection fails; ``acked[n]`` is when row ``n``'s
    commit was acknowledged."""

    def __init__(self, url: str, writer: int) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.writer = writer
        self.acked: dict[int, float] = {}

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                for n in itertools.count(1):
                    conn.execute("INSERT INTO commits VALUES (%s, %s)", [self.writer, n])
                    self.acked[n] = time.time()
        except psycopg.Error:
            return


def test_asynchronous_replication_loses_a_tail():
    """An asynchronous standby promoted after a crash has every commit up to some point,
    and none after: what it lacks is the primary's last acknowledged commits (measured,
    printed: how many, and over how long before the primary's end they were acknowledged)."""
    pair = ReplicatedPair(synchronous=False)
    try:
        primary = pair.primary.url("pgstage")
        query(primary, "CREATE TABLE commits (writer int, n int, PRIMARY KEY (writer, n))")
        writers = [Writer(primary, k) for k in range(WRITERS)]
        for writer in writers:
            writer.start()
        lags: list[float] = []

        def progressed() -> bool:
            # How far behind the standby's write acknowledgements run, meanwhile (ms).
            lags.extend(
                lag
                for (lag,) in query(
                    primary,
                    "SELECT extract(epoch FROM write_lag) * 1000 FROM pg_stat_replication "
                    "WHERE write_lag IS NOT NULL",
                )
            )
            return all(len(w.acked) >= 300 for w in writers)

        wait_for(progressed, timeout=60, interval=0.05, message="the writers to commit")
        pair.fail_over()
        for writer in writers:
            writer.join(timeout=30)
        present = dict.fromkeys(range(WRITERS), (0, 0)) | {
            k: (last, rows)
            for k, last, rows in query(
                pair.standby.url("pgstage"),
                "SELECT writer, max(n), count(*) FROM commits GROUP BY 1",
            )
        }
    finally:
        pair.remove()
    lost = []
    for writer in writers:
        last, rows = present[writer.writer]
        # A prefix of this writer's commits, with no hole; at most one past the last one
        # acknowledged (its commit reached the standby, its acknowledgement was cut).
        assert rows == last <= len(writer.acked) + 1
        lost += [at for n, at in writer.acked.items() if n > last]
    acked = sorted(at for w in writers for at in w.acked.values())
    # Over how long before the primary's last acknowledgement (it was up at least until
    # then) the missing ones were made: 0 ms when only the very last one is missing.
    window = (acked[-1] - min(lost)) * 1000 if lost else 0.0
    print(
        f"\nasynchronous standby, primary crashed under {WRITERS} writers ({len(acked)} commits "
        f"acknowledged): {len(lost)} acknowledged commits missing after the promotion, "
        f"made in the last {window:.1f} ms before the primary's last acknowledgement; "
        f"the standby's write lag meanwhile: at most {max(lags, default=0):.1f} ms"
    )
