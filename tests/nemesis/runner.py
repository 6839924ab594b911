"""Run the nemesis once: ``python -m tests.nemesis.runner --seed N --seconds S``.

Starts a private PostgreSQL on a free TCP port, migrates it, starts the workers behind
their proxies (two of the old release, the rest new), runs the workload and the nemesis
for ``--seconds``, heals every fault, waits until the system is quiet (at most the
checker's bound), reads the database, merges the workers' effects into the history and
checks it. Prints the seed, the history's path and the verdict; exits 1 on a violation.

Everything random comes from the seed (the workload's and the nemesis' draws each from a
generator of their own); what the processes do with it is up to the machine, so a replay
repeats the faults, not the interleaving.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from tests.nemesis import forensics
from tests.nemesis.checker import QUIET_BOUND_SECONDS, Report, check
from tests.nemesis.cluster import CONCURRENCY, ROOT, WORKER_SETTINGS, Cluster, free_port
from tests.nemesis.history import History, read_history
from tests.nemesis.nemesis import KINDS, NemesisConfig

#: The fault kinds of the default run: every kind (a live worker's heartbeat has a
#: connection of its own, so the database's faults and a reset no longer take its jobs).
DEFAULT_KINDS = KINDS
RELEASES = ["old", "old", "new"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tests.nemesis.runner")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed (random if absent)")
    parser.add_argument("--seconds", type=float, default=90, help="how long faults are drawn")
    parser.add_argument(
        "--kinds",
        default=",".join(DEFAULT_KINDS),
        help=f"fault kinds, comma-separated (all: {','.join(KINDS)})",
    )
    parser.add_argument(
        "--scale", type=float, default=0.1, help="fault durations: the issue's ranges times this"
    )
    parser.add_argument(
        "--new-task",
        action="store_true",
        help="also enqueue jobs of the task only the new release has",
    )
    parser.add_argument("--out", default="", help="the run's directory (default: a new one)")
    parser.add_argument(
        "--outage",
        default="",
        metavar="AT,SECONDS",
        help="besides the drawn faults, the database refuses connections for SECONDS, "
        "AT seconds into the run (a test's forced outage)",
    )
    args = parser.parse_args(argv)
    if args.outage:
        try:
            at, seconds = (float(part) for part in args.outage.split(","))
        except ValueError:
            parser.error("--outage takes AT,SECONDS")
        args.outage = (at, seconds)
    unknown = set(args.kinds.split(",")) - set(KINDS)
    if unknown:
        parser.error(f"unknown fault kinds: {sorted(unknown)}")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1, 10**6)
    return args


def run(args: argparse.Namespace) -> tuple[Report, Path]:
    run_dir = Path(args.out or tempfile.mkdtemp(prefix=f"nemesis-{args.seed}-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o755)
    history = History(run_dir / "history.jsonl")
    print(f"nemesis seed {args.seed}: history {history.path}", flush=True)
    history.record(
        "run",
        seed=args.seed,
        seconds=args.seconds,
        kinds=args.kinds,
        scale=args.scale,
        new_task=args.new_task,
        concurrency=CONCURRENCY,
    )

    from tests.acceptance.private_pg import private_server

    port = free_port()
    with _reaped(history.path), private_server(port=port) as server:
        history.record("database", event="started", data_dir=str(server.data_dir), port=port)
        os.environ.update(WORKER_SETTINGS)
        os.environ["DATABASE_URL"] = server.url
        os.environ["PGAPPNAME"] = "nemesis-runner"
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()
        from django.core.management import call_command

        # The runner enqueues the tasks of both releases.
        import tests.nemesis.tasks_new  # noqa: F401 (imports tests.nemesis.tasks too)
        from tests.nemesis.final import final_read, unfinished
        from tests.nemesis.nemesis import Nemesis
        from tests.nemesis.workload import INQUIRY_POSITIONS, Workload, WorkloadConfig, set_up

        call_command("migrate", verbosity=0)
        set_up()
        cluster = Cluster(
            database_port=port, run_dir=run_dir, history=history, releases=list(RELEASES)
        )
        # An operator's cancel runs the job's give-up hook here, in the cancel's transaction
        # (queueing.jobs.job_cancel): its effects are this process's.
        os.environ["NEMESIS_EFFECTS_DIR"] = str(cluster.effects_dir)
        seeds = random.Random(args.seed)
        workload = Workload(
            history=history,
            rng=random.Random(seeds.random()),
            config=WorkloadConfig(new_task=args.new_task),
        )
        nemesis = Nemesis(
            cluster=cluster,
            server=server,
            history=history,
            rng=random.Random(seeds.random()),
            config=NemesisConfig(kinds=tuple(args.kinds.split(",")), scale=args.scale),
        )
        monitor = InvariantMonitor(history)
        interrupted = False
        try:
            cluster.start_all()
            workload.start()
            nemesis.start()
            if args.outage:
                nemesis.force_outage(*args.outage)
            monitor.start()
            time.sleep(args.seconds)
            nemesis.join()
            if args.new_task:
                nemesis.roll_forward()
            last_fault = time.monotonic()
            history.record("healed")
            # Clients stop a little later: the last fault's aftermath meets fresh work.
            time.sleep(3)
            workload.join()
            quiet = _wait_quiet(unfinished, last_fault)
            if quiet is None:
                forensics.record_unfinished(history, [w.pid for w in cluster.workers if w.alive])
            monitor.join()
            history.record("quiet", seconds=quiet)
            database_returns = [
                line["wall"]
                for line in read_history(history.path)
                if line["type"] == "database" and line["event"] == "up"
            ]
            final = final_read(
                database_returns=database_returns,
                positions=INQUIRY_POSITIONS,
                clocks={
                    "stall": float(WORKER_SETTINGS["STALLED_WORKER_SECONDS"]),
                    "recovery": float(WORKER_SETTINGS["STALLED_RECOVERY_SECONDS"]),
                },
            )
        except BaseException:
            # Stopped from outside (SIGTERM, SIGINT) or failed: tear down at once.
            interrupted = True
            raise
        finally:
            # A signal during the teardown must not cut it short: that would leave the
            # server (in a session of its own) and the workers (in theirs) running.
            _tearing_down.set()
            nemesis.close()
            workload.stop.set()
            cluster.shutdown(grace=TEARDOWN_GRACE_SECONDS if interrupted else 30)
            from django.db import connections

            connections.close_all()
            if not interrupted:
                _tearing_down.clear()
        from tests.nemesis.effects import read_effects

        for effect in read_effects(cluster.effects_dir):
            history.record_line(effect)
        from tests.nemesis.worker_logs import fetch_failing_lines, pruning_lines

        for logged in fetch_failing_lines(read_history(history.path)):
            history.record_line(logged)
        for logged in pruning_lines(read_history(history.path)):
            history.record_line(logged)
        history.record("final", **final)
    history.close()
    report = check(read_history(history.path))
    (run_dir / "report.json").write_text(json.dumps(asdict(report), indent=2, default=str))
    return report, history.path


@contextlib.contextmanager
def _reaped(history_path: Path) -> Iterator[None]:
    """A reaper (:mod:`tests.nemesis.reaper`, in a session of its own) for the run: it
    stops what the run started should the runner die without its teardown (SIGKILL).
    Told ``done`` once the teardown has run."""
    reaper = subprocess.Popen(
        [sys.executable, "-m", "tests.nemesis.reaper", str(history_path)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        start_new_session=True,
    )
    assert reaper.stdin is not None
    torn_down = False
    try:
        yield
        torn_down = True
    finally:
        with contextlib.suppress(BrokenPipeError):
            if torn_down:
                reaper.stdin.write(b"done\n")
            reaper.stdin.close()
        try:
            reaper.wait(timeout=30)
        except subprocess.TimeoutExpired:
            reaper.kill()


class InvariantMonitor:
    """The safety invariants (tests/invariants.py, ``ALWAYS``) hold at every moment: checked
    every few seconds while faults run; each check that finds a violation is recorded."""

    def __init__(self, history: History, every: float = 5.0) -> None:
        self.history = history
        self.every = every
        self.checks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="invariants")

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.history.record("invariant_checks", count=self.checks)

    def _run(self) -> None:
        from django.db import connection

        from tests.invariants import violations

        while not self._stop.wait(self.every):
            try:
                found = violations()
            except Exception:
                connection.close()  # the database is away: nothing to check
                continue
            self.checks += 1
            if found:
                self.history.record("check", violations=found)
        connection.close()


def _wait_quiet(unfinished, since: float) -> float | None:
    """Seconds from ``since`` until nothing is unfinished; None past the bound."""
    while time.monotonic() - since < QUIET_BOUND_SECONDS:
        try:
            if not unfinished():
                return time.monotonic() - since
        except Exception:
            from django.db import connection

            connection.close()
        time.sleep(1)
    return None


#: A teardown from outside gives draining workers this long before SIGKILL.
TEARDOWN_GRACE_SECONDS = 5.0
_tearing_down = threading.Event()


def _exit_on_signal(signum: int, frame: object) -> None:
    """The first SIGTERM or SIGINT ends the run (its ``finally`` tears the cluster down);
    one that comes during the teardown is ignored, so that it completes."""
    if _tearing_down.is_set():
        return
    _tearing_down.set()
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    # Stopped from outside (a test's timeout, a supervisor, ^C): stop the workers, the
    # proxies and the server on the way out, at once.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGINT, _exit_on_signal)
    report, path = run(args)
    print(json.dumps(report.measures, indent=2, default=str))
    replay = (
        f"make nemesis SEED={args.seed} SECONDS={args.seconds:g} KINDS={args.kinds} "
        f"SCALE={args.scale:g}" + (" NEW_TASK=1" if args.new_task else "")
    )
    if report.violations:
        print(f"\nnemesis seed {args.seed}: {len(report.violations)} violations", flush=True)
        for violation in report.violations[:30]:
            print("- " + json.dumps(violation, default=str)[:1000])
        print(forensics.report(read_history(path)))
        print(f"\nseed {args.seed}; history {path}\nreplay: {replay}", flush=True)
        return 1
    print(f"\nnemesis seed {args.seed}: no violation; history {path}\nreplay: {replay}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
