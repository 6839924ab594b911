"""``python -m bench.waiting_jobs``: what a fetch and an ``unrunnable_tasks`` read cost as
the waiting jobs grow, beside procrastinate's own fetch.

Against the (migrated) database of ``DATABASE_URL``, whose job table must hold no waiting
job: for each size N it bulk-inserts N waiting jobs, half of a task that the measuring
worker lacks (older and of higher priority, so an ordered scan meets them first), half of
its own, each half over two queues; ``VACUUM ANALYZE``; then times, after one warm-up,
the median of ``--repetitions`` executions of each statement, each in a transaction
rolled back (a fetch takes its job back). The worker rows are registered as the worker
would, with its task names (and, for the scrape in which every task has a worker, with
both). Its own rows are deleted afterwards. Nothing here asserts a time.

* ``fetch``: the worker's fetch (``fetch_job``, which calls ``pgstage_fetch_job_v1``, under
  its own settings), its queues all;
* ``procrastinate fetch``: ``procrastinate_fetch_job_v2``, the baseline (it takes the
  other task's job, which the worker would then fail);
* ``unrunnable, all served``: ``unrunnable_tasks`` when a live worker takes every job;
* ``unrunnable, N/2 unserved``: when no live worker has the other task: it counts those
  jobs, so it grows with them, and reads the index alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import psycopg

from queueing.planner import WALK_SETTINGS
from queueing.sql import load
from queueing.sql import queries as queueing_queries

worker_queries = load("queueing", "worker.sql")
MINE, OTHER = "bench.waiting.mine", "bench.waiting.other"


def _timed(
    conn: psycopg.Connection, query: str, params: dict, repetitions: int, *, walk: bool = True
) -> float:
    """``walk``: under the planner settings pgstage runs it with (``queueing.planner``),
    set before the clock starts (the worker sends them in the statement's round trip)."""
    samples = []
    for attempt in range(repetitions + 1):
        with conn.transaction(force_rollback=True):
            if walk:
                conn.execute(WALK_SETTINGS)
            started = time.perf_counter()
            conn.execute(query, params).fetchall()
            if attempt:  # the first is a warm-up
                samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def _fill(conn: psycopg.Connection, count: int) -> None:
    for task_name, priority in ((OTHER, 5), (MINE, 0)):
        conn.execute(
            "INSERT INTO procrastinate_jobs (task_name, queue_name, priority, args, status)"
            " SELECT %s, CASE WHEN g %% 2 = 0 THEN 'a' ELSE 'b' END, %s, '{}', 'todo'"
            " FROM generate_series(1, %s) AS g",
            [task_name, priority, count // 2],
        )


def _register(conn: psycopg.Connection, task_names: list[str]) -> int:
    return conn.execute(
        worker_queries["register_worker"], {"task_names": task_names, "queues": None, "hooks": []}
    ).fetchone()[0]


def _clean(conn: psycopg.Connection) -> None:
    conn.execute("DELETE FROM procrastinate_jobs WHERE task_name IN (%s, %s)", [MINE, OTHER])
    conn.execute(
        "DELETE FROM procrastinate_workers WHERE id IN (SELECT worker_id FROM"
        " pgstage_worker_tasks WHERE %s = ANY(task_names))",
        [MINE],
    )


def measure(url: str, sizes: list[int], repetitions: int) -> list[tuple[int, str, float]]:
    rows = []
    with psycopg.connect(url, autocommit=True) as conn:
        waiting = conn.execute("SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'")
        if waiting.fetchone()[0]:
            raise SystemExit("the job table holds waiting jobs: use a database of its own")
        try:
            for size in sizes:
                _clean(conn)
                _fill(conn, size)
                conn.execute("VACUUM ANALYZE procrastinate_jobs")
                mine_only = _register(conn, [MINE])
                fetch = {
                    "queues": None,
                    "worker_id": mine_only,
                    "task_names": [MINE],
                    "timeout_tasks": [],
                    "timeout_seconds": [],
                    "unflushed": [],
                    # Registered just now: its beat passes any bound the worker uses.
                    "beat_seconds": 19.0,
                }
                statements = [
                    ("fetch", worker_queries["fetch_job"], fetch),
                    (
                        "procrastinate fetch",
                        "SELECT * FROM procrastinate_fetch_job_v2(NULL, %(worker_id)s)",
                        fetch,
                    ),
                    ("unrunnable, N/2 unserved", queueing_queries["unrunnable_tasks"], {}),
                ]
                for name, query, params in statements:
                    params = {"seconds": 30, "clock": "stalled_jobs", **params}
                    # The fetch function carries its own settings.
                    walk = name.startswith("unrunnable")
                    rows.append((size, name, _timed(conn, query, params, repetitions, walk=walk)))
                _register(conn, [MINE, OTHER])
                served = _timed(
                    conn,
                    queueing_queries["unrunnable_tasks"],
                    {"seconds": 30, "clock": "stalled_jobs"},
                    repetitions,
                )
                rows.append((size, "unrunnable, all served", served))
        finally:
            _clean(conn)
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100000,200000")
    parser.add_argument("--repetitions", type=int, default=7)
    args = parser.parse_args(argv)
    url = os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("DATABASE_URL names the database to measure on")
    sizes = [int(size) for size in args.sizes.split(",")]
    print(f"{'waiting jobs':>12}  {'statement':<26} {'median ms':>9}")
    for size, name, ms in measure(url, sizes, args.repetitions):
        print(f"{size:>12}  {name:<26} {ms:>9.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
