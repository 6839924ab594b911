"""Throughput and memory of pgstage's stage path against plain procrastinate, in one run.

Both variants enqueue N jobs and drain them with one real worker subprocess
(``--one-shot``) on the same database:

* plain — procrastinate's ``task.defer()`` and a task doing its business write by hand;
* pgstage — ``queueing.enqueue`` with an EXCLUSIVE singleton key, and a task that claims in
  the stage ledger and completes compare-and-set (exactly-once effects).

Reported: enqueue rate, drain rate, worker peak RSS, and pgstage/plain ratios.
Run: ``python -m bench.throughput [--jobs N] [--concurrency C]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _prepare() -> None:
    from django.db import connection

    from bench.tasks import BenchStep

    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_plain (unit text PRIMARY KEY)")
        if "bench_steps" not in connection.introspection.table_names():
            with connection.schema_editor() as editor:
                editor.create_model(BenchStep)
        cursor.execute("TRUNCATE bench_plain, bench_steps")
        cursor.execute("DELETE FROM procrastinate_jobs WHERE task_name LIKE 'bench.%%'")


def _drain(concurrency: int) -> tuple[float, int]:
    """Run a one-shot worker on the bench queue; return (seconds, peak RSS in KiB)."""
    env = {**os.environ, "PGSTAGE_TASK_MODULES": "bench.tasks", "LOG_LEVEL": "WARNING"}
    started = time.perf_counter()
    process = subprocess.Popen(
        [
            sys.executable,
            "manage.py",
            "procrastinate",
            "worker",
            "--one-shot",
            "--queues=bench",
            f"--concurrency={concurrency}",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    # wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would mix the variants).
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"the bench worker failed with status {status}")
    return elapsed, usage.ru_maxrss


def run_variant(name: str, jobs: int, concurrency: int) -> dict[str, float]:
    from bench.tasks import BENCH_KEY, plain
    from queueing.enqueue import Policy, enqueue

    _prepare()
    started = time.perf_counter()
    for i in range(jobs):
        if name == "plain":
            plain.configure(queue="bench").defer(unit=str(i))
        else:
            enqueue(
                "bench.stage",
                args={"unit": str(i)},
                queue="bench",
                key=BENCH_KEY.build(unit=i),
                policy=Policy.EXCLUSIVE,
            )
    enqueue_s = time.perf_counter() - started
    drain_s, rss = _drain(concurrency)
    return {"enqueue_per_s": jobs / enqueue_s, "drain_per_s": jobs / drain_s, "rss_kib": rss}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput")
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)

    from django.db import connection

    from queueing.display import format_table

    print(
        f"throughput: {args.jobs} jobs, worker concurrency {args.concurrency}, "
        f"database {connection.settings_dict['NAME']}"
    )
    plain = run_variant("plain", args.jobs, args.concurrency)
    stage = run_variant("pgstage", args.jobs, args.concurrency)
    rows = [
        [
            metric,
            f"{plain[metric]:.0f}",
            f"{stage[metric]:.0f}",
            f"{stage[metric] / plain[metric]:.2f}",
        ]
        for metric in ("enqueue_per_s", "drain_per_s", "rss_kib")
    ]
    print(format_table(["metric", "plain procrastinate", "pgstage stage path", "ratio"], rows))


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    main(sys.argv[1:])
