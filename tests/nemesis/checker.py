"""The nemesis checker: judges a recorded history (and the final read it ends with).

pgstage executes a job at least once and makes its *effects* happen once (docs/reliability.md).
A job may run again when its run's outcome could not be saved — its worker died or was
cut off (SIGKILL, exit, a partition past the stall threshold), or its connection failed
under it (a reset, a terminated session, a database restart, crash or refusal, a statement
timeout) — but a worker that is alive and reachable keeps its job: no sweep, operator or
recovery takes it while it heart-beats (invariant 12 of
docs/design.md, and docs/reliability.md "silence
counts from the server's start and from when recovery resumed"). So the properties:

Generic jobs (their effects are lines outside the database, :mod:`tests.nemesis.effects`):

- **G1 no twin run**: a run of job J never starts while an earlier run of J is still in
  progress on a worker process that is alive and was not partitioned since that run began.
  (An earlier run whose process exited, or whose worker was partitioned, may be open: it
  was declared dead, and its outcome is fenced.)
- **G2 a completion is repeated only after a fault**: a job that ran to its end more than
  once had, between its earlier completion's start and its next run's start, a fault that
  could keep the outcome from being saved: a database restart, crash or refusal, a storm of
  terminated sessions, a lock on ``procrastinate_jobs`` (statement timeout), or a kill,
  drain, deploy, settings change (``reconfigure``), reset or partition of the earlier run's
  worker. An operator's sweep or
  retry is no such fault.
- **G3 nothing lost**: every job without a hook that was enqueued (the enqueue answered)
  and is over ended ``succeeded``, with at least one completed run; and no job ends
  ``failed`` without a single run (a worker that lacks its task must leave it waiting).
  One that ran more than :data:`STALL_RECOVERIES` times, each time on a worker that died
  or was cut off under it (a run that reached its end on a worker cut off during it
  counts: its outcome could not be saved), may end ``failed``: stalled recovery's
  poison-pill bound (listed as ``failed_after_stalls``). A
  job still waiting or running at the end is unfinished: L1 says so.
- **G4 every owed hook runs once**: a job with a give-up hook that ends ``failed`` or
  ``cancelled`` has its hook committed exactly once (``hook_committed``: the hook's
  transaction, which deletes its owed row, committed); one that succeeded has none. A hook
  whose transaction rolled back runs again: its ``hook`` lines may be more.

Domains: the safety invariants of ``tests/invariants.py`` every 5 s while faults run
(``check`` lines), and on the final read the invariants 1-10 (settled: every
terminal analysis saved, every run judged, nothing waiting), its liveness checks 11,
and two more fenced effects: a complete analysis is never refunded, and an inquiry whose
extract succeeded holds exactly its positions (a doubled stage would double them; the
stage successes, charges, refunds, runs and judgements are counted once each by the
invariants 1, 5a, 5b, 6a and 7a).

Liveness, timed from the end of the last fault (every fault heals what it did):

- **L1 quiet within the bound**: within :data:`QUIET_BOUND_SECONDS` every job is terminal,
  every inquiry has four successes or a stage given up, every analysis is terminal and
  saved, every run judged, no hook owed. The time it took is measured.
- **L2 jobs start again after the database's return** within :data:`RESTART_BOUND_SECONDS`
  of it, after every outage shorter than the outage window of some worker then running
  (a restart, a refusal; each worker's window is on its ``start`` line):
  measured for every return (``restart_seconds``, the worst ``restart_seconds_max``); a
  violation when jobs waited for the return, unless a fault that keeps every worker from
  starting a job (another outage, a storm of terminated sessions, a lock on
  ``procrastinate_jobs``) ran within the bound: it began no later than the bound's end
  and ended after the return. One that began after the bound had passed excuses nothing.
  A kill, drain, reset or partition takes one worker: the others must start jobs — unless
  every slot of each of them (started before the return, neither draining nor
  partitioned) stayed held by a run begun before the return until a bound before the
  first start at the earliest, or until a fault that holds every worker back began
  within a bound of the slot's freeing: then the workers were busy, not stuck. A slot that freed,
  or a partition that healed, more than a bound before the start excuses nothing. Each
  excused late start is listed
  (``late_restarts_excused``).
- **L3 a worker never exits on its own while the database is reachable** (an exit seen
  within 2 s of the database's or its link's return counts as one while it was away),
  **nor gives up sooner than its outage window** (``QUEUEING_DATABASE_OUTAGE_SECONDS``, on
  its ``start`` line) after the database or its link went away. How long that was when a
  worker gave up is measured. A worker pruned while it was cut off (its row deleted by one
  of a shorter window, after a ``reconfigure``) registers again: counted from the
  workers' logs (``registered_again``), as are the prunes (``pruned_workers``).
- **L5 a worker registers again only once its row was pruned** (a prune some worker
  logged): one that registers again with its row still there leaves that row
  behind, a worker nobody runs.
- **L4 a live worker fetches again within the bound** once no fault stands in its way:
  a worker whose fetches keep failing (its log's "database error while fetching jobs",
  :mod:`tests.nemesis.worker_logs`) for :data:`RESTART_BOUND_SECONDS` after the last
  fault that could explain it ended is stuck while it looks alive. Explaining faults: an
  outage, a storm of terminated sessions, a lock on ``procrastinate_jobs``, a reset or
  partition of that worker, and a deploy's migration while it runs. Any part of a
  failing stretch no such fault covers counts, not only its end; and a worker whose
  fetches fail :data:`UNEXPLAINED_FETCH_FAILURES` times outside every such fault (and a
  bound after it), however short each stretch, is stuck as well. The longest
  unexplained stretch is measured (``fetch_unexplained_seconds_max``).
"""

from __future__ import annotations

import itertools
import json
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.nemesis.history import read_history

#: The last fault's end to quiet: the stall threshold and one recovery (6.5 s), the
#: analysis_resume sweep's grace and period (60 + 30 s: a lost analysis task found again),
#: and a retry chain at the workers' capped backoff (8 attempts at most 5 s apart).
QUIET_BOUND_SECONDS = 150.0
#: Jobs start again within 5 s of the database's return: the outage recovery's target.
RESTART_BOUND_SECONDS = 5.0
#: The workers' ``QUEUEING_DATABASE_OUTAGE_SECONDS`` (the settings' default): the restart bound
#: holds after an outage shorter than it.
OUTAGE_WINDOW_SECONDS = 300.0
#: An exit seen this soon after the database (or the worker's link) came back happened
#: while it was away (the supervisor sees an exit within 0.2 s; the margin is for load).
EXIT_GRACE_SECONDS = 2.0
HOOKED_TASKS = ("nemesis.settled", "nemesis.new_effect")
#: Fault kinds that can keep any running job's outcome from being saved.
GLOBAL_FAULTS = {"pg_restart", "pg_crash", "pg_down", "terminate"}
DATABASE_FAULTS = {"pg_restart", "pg_crash", "pg_down"}
#: Stalled recoveries a job gets before it fails (the workers'
#: ``STALLED_JOB_MAX_RECOVERIES``, ``tests.nemesis.cluster.WORKER_SETTINGS``).
STALL_RECOVERIES = 3
#: Each worker's slots (``--concurrency``), when the history does not say.
DEFAULT_CONCURRENCY = 2
#: Fault kinds that can keep the outcome of a job of *their* worker from being saved.
WORKER_FAULTS = {"kill", "term", "reset", "partition", "deploy", "reconfigure"}
#: Worker faults that drain every worker in turn (a rolling restart).
ROLLING_FAULTS = {"deploy", "reconfigure"}
#: A worker may give up this much before its outage window, counted from the fault's
#: start: its last answer may have come up to a heartbeat (1 s) and a round trip before.
WINDOW_SLACK_SECONDS = 2.0


@dataclass
class Run:
    job_id: int
    pid: int
    start: float
    end: float | None = None
    ok: bool = False


@dataclass
class Report:
    violations: list[dict[str, Any]] = field(default_factory=list)
    measures: dict[str, Any] = field(default_factory=dict)

    def violate(self, prop: str, **detail: Any) -> None:
        self.violations.append({"property": prop, **detail})


@dataclass
class Window:
    kind: str
    start: float
    end: float
    worker: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def fault_windows(history: list[dict]) -> list[Window]:
    invokes: dict[int, dict] = {}
    windows = []
    for line in history:
        if line["type"] != "fault":
            continue
        if line["phase"] == "invoke":
            invokes[line["id"]] = line
        elif line["id"] in invokes:
            begun = invokes.pop(line["id"])
            windows.append(
                Window(
                    kind=begun["kind"],
                    start=begun["mono"],
                    end=line["mono"],
                    worker=begun.get("worker"),
                    detail={**begun, "outcome": line.get("value") or line.get("error")},
                )
            )
    # A fault still open at the end of the history ends with it.
    last = history[-1]["mono"] if history else 0.0
    windows += [
        Window(kind=b["kind"], start=b["mono"], end=last, worker=b.get("worker"), detail=b)
        for b in invokes.values()
    ]
    return windows


def _pids(history: list[dict]) -> tuple[dict[int, int], dict[int, float]]:
    """pid → worker index, and pid → when its exit was seen."""
    worker_of, exited = {}, {}
    for line in history:
        if line["type"] == "worker" and line.get("pid"):
            if line["event"] == "start":
                worker_of[line["pid"]] = line["worker"]
            elif line["event"] == "exit":
                exited.setdefault(line["pid"], line["mono"])
    return worker_of, exited


def outage_windows(history: list[dict]) -> dict[int, float]:
    """pid → the outage window its worker ran with (:data:`OUTAGE_WINDOW_SECONDS` for a
    history whose start lines do not say)."""
    return {
        line["pid"]: float(line.get("outage_window") or OUTAGE_WINDOW_SECONDS)
        for line in history
        if line["type"] == "worker" and line["event"] == "start" and line.get("pid")
    }


def _running_windows(history: list[dict], at: float) -> list[float]:
    """The outage windows of the worker processes running at ``at``."""
    windows = outage_windows(history)
    running: dict[int, int] = {}  # worker index → pid
    for line in history:
        if line["type"] != "worker" or line["mono"] > at or not line.get("pid"):
            continue
        if line["event"] == "start":
            running[line["worker"]] = line["pid"]
        elif line["event"] == "exit" and running.get(line["worker"]) == line["pid"]:
            del running[line["worker"]]
    return [windows[pid] for pid in running.values()]


def runs_of(history: list[dict]) -> dict[int, list[Run]]:
    """Each job's runs from its effect lines (a start, then its end or error, per pid)."""
    runs: dict[int, list[Run]] = defaultdict(list)
    open_runs: dict[tuple[int, int], Run] = {}
    for line in history:
        if line["type"] != "effect" or line["job_id"] is None:
            continue
        slot = (line["job_id"], line["pid"])
        if line["event"] == "start":
            run = Run(job_id=line["job_id"], pid=line["pid"], start=line["mono"])
            open_runs[slot] = run
            runs[run.job_id].append(run)
        elif slot in open_runs:
            run = open_runs.pop(slot)
            run.end = line["mono"]
            run.ok = line["event"] == "end"
    return runs


def check(history: list[dict]) -> Report:
    report = Report()
    final = next((line for line in reversed(history) if line["type"] == "final"), None)
    if final is None:
        report.violate("the history has no final read (the run did not end)")
        return report
    windows = fault_windows(history)
    worker_of, exited = _pids(history)

    def partitioned(pid: int, start: float, end: float) -> bool:
        worker = worker_of.get(pid)
        return any(
            w.kind == "partition" and w.worker == worker and w.start < end and w.end > start
            for w in windows
        )

    def outcome_at_risk(pid: int, start: float, end: float) -> bool:
        worker = worker_of.get(pid)
        if pid in exited and exited[pid] <= end:
            return True
        for w in windows:
            if w.start > end or w.end < start:
                continue
            if w.kind in GLOBAL_FAULTS:
                return True
            if w.kind == "statement_timeout" and w.detail.get("table") == "procrastinate_jobs":
                return True
            if w.kind in ROLLING_FAULTS and _rolled(w, worker):
                return True
            if w.kind in WORKER_FAULTS and w.worker == worker:
                return True
        return False

    runs = runs_of(history)
    _check_generic(report, history, final, runs, partitioned, outcome_at_risk, exited)
    _check_domains(report, history, final)
    _check_liveness(report, history, final, windows, runs)
    _check_fetching(report, history, windows)
    report.measures["runs"] = sum(len(r) for r in runs.values())
    report.measures["faults"] = _count(w.kind for w in windows)
    return report


def _count(items) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for item in items:
        counts[item] += 1
    return dict(sorted(counts.items()))


def _check_generic(report, history, final, runs, partitioned, outcome_at_risk, exited) -> None:
    for job_id, job_runs in runs.items():
        for i, later in enumerate(job_runs):
            for earlier in job_runs[:i]:
                still_running = earlier.end is None or earlier.end > later.start
                if not still_running:
                    continue
                dead = earlier.pid in exited and exited[earlier.pid] <= later.start
                if not dead and not partitioned(earlier.pid, earlier.start, later.start):
                    report.violate(
                        "G1 a job ran twice at once on a live, reachable worker",
                        job=job_id,
                        first={"pid": earlier.pid, "start": earlier.start, "end": earlier.end},
                        second={"pid": later.pid, "start": later.start},
                    )
        completed = [r for r in job_runs if r.ok]
        for earlier, later in itertools.pairwise(completed):
            if not outcome_at_risk(earlier.pid, earlier.start, later.start):
                report.violate(
                    "G2 a job completed twice with no fault that could lose its outcome",
                    job=job_id,
                    runs=[(r.pid, r.start, r.end) for r in completed],
                )
    hooks: dict[str, int] = defaultdict(int)
    for line in history:
        if line["type"] == "effect" and line["event"] == "hook_committed":
            hooks[line["key"]] += 1
    enqueued = {
        line["value"]
        for line in history
        if line["type"] == "op" and line["phase"] == "ok" and line.get("op") in _GENERIC_OPS
    }
    report.measures["generic_jobs"] = len(final["generic_jobs"])
    report.measures["hooks"] = sum(hooks.values())
    report.measures["completed_runs"] = sum(
        1 for job_runs in runs.values() for r in job_runs if r.ok
    )
    stalled_out: list[int] = []
    for job_id, task, status, key, attempts in final["generic_jobs"]:
        done = [r for r in runs.get(job_id, []) if r.ok]
        if status == "failed" and not runs.get(job_id):
            report.violate(
                "G3 a job failed without a single run", job=job_id, task=task, attempts=attempts
            )
        if task in HOOKED_TASKS:
            owed = 1 if status in ("failed", "cancelled", "aborted") else 0
            if hooks.get(key, 0) != owed:
                report.violate(
                    "G4 a give-up hook committed other than once for a job that gave up "
                    "(never for one that succeeded)",
                    job=job_id,
                    task=task,
                    status=status,
                    hooks=hooks.get(key, 0),
                    runs=len(runs.get(job_id, [])),
                )
        elif status == "failed" and _worker_died_each_time(
            runs.get(job_id, []), exited, partitioned
        ):
            # Stalled recovery's poison-pill bound: a job whose worker died under it more
            # than STALL_RECOVERIES times fails (docs/reliability.md), faults or not.
            stalled_out.append(job_id)
        elif (
            job_id in enqueued
            and status not in ("todo", "doing")  # unfinished: L1 says so
            and (status != "succeeded" or not done)
            and runs.get(job_id)
        ):
            report.violate(
                "G3 a job was lost",
                job=job_id,
                task=task,
                status=status,
                attempts=attempts,
                runs=len(runs.get(job_id, [])),
            )

    report.measures["failed_after_stalls"] = stalled_out


def _worker_died_each_time(job_runs: list[Run], exited, partitioned) -> bool:
    """Whether the job ran more than :data:`STALL_RECOVERIES` times, each on a worker
    process that died during it (before its end) or was cut off during it: stalled
    recovery then fails it by design, as it would a job that kills its worker. A run that
    reached its end counts only when its worker was cut off during it: its outcome could
    not be saved (seed 12: three kills, then a partition under the fourth run, which ended
    after the heal, its job already failed)."""
    if len(job_runs) <= STALL_RECOVERIES:
        return False
    return all(
        (not run.ok and run.pid in exited and exited[run.pid] >= run.start)
        or partitioned(run.pid, run.start, run.end if run.end is not None else float("inf"))
        for run in job_runs
    )


_GENERIC_OPS = ("effect", "settled", "new_effect")


def _check_domains(report, history, final) -> None:
    for line in history:
        if line["type"] == "check":
            for name, rows in line["violations"].items():
                report.violate(f"invariant {name} (while faults ran)", rows=rows, at=line["mono"])
    checks = next((line for line in history if line["type"] == "invariant_checks"), None)
    report.measures["invariant_checks"] = checks["count"] if checks else 0
    for name, rows in final["invariants"].items():
        report.violate(f"invariant {name}", rows=rows)
    for name, rows in final["extra_safety"].items():
        report.violate(name, rows=rows)
    report.measures["domain"] = final["domain_counts"]


def _holds_every_worker(window: Window) -> bool:
    """Whether ``window`` is a fault that keeps every worker from fetching: an outage, a
    storm of terminated sessions, or a lock on ``procrastinate_jobs``."""
    return (
        window.kind in DATABASE_FAULTS
        or window.kind == "terminate"
        or (
            window.kind == "statement_timeout"
            and window.detail.get("table") == "procrastinate_jobs"
        )
    )


def _slots_held(
    history: list[dict],
    runs: dict[int, list[Run]],
    windows: list[Window],
    returned: float,
    seconds: float,
) -> bool:
    """Whether no worker that could have started a job after ``returned`` had a whole
    bound of free time before the first start (``seconds`` after it): each held all its
    slots with runs begun before the return, or was partitioned, until a bound before
    that start at the earliest (or until its drain's start, or its exit). A slot that freed, or a
    partition that healed, more than a bound before the start left the worker idle for
    longer than it may be: stuck, not busy. So does a fault that holds every worker back
    (the next outage …) and begins before a bound of free time has passed: busy until
    +10 s, then the database away until +51 s, is no stuck worker. A worker started after
    the return is booting,
    not recovering. Runs are the generic jobs' (the domains' jobs last a fraction of a
    second)."""
    run_line = next((line for line in history if line["type"] == "run"), {})
    slots = run_line.get("concurrency", DEFAULT_CONCURRENCY)
    first_start = returned + seconds
    started: dict[int, float] = {}
    index: dict[int, int] = {}
    until: dict[int, float] = {}
    for line in history:
        if line["type"] != "worker" or not line.get("pid"):
            continue
        if line["event"] == "start":
            started[line["pid"]] = line["mono"]
            index[line["pid"]] = line["worker"]
        elif line["event"] in ("signal", "exit"):
            until.setdefault(line["pid"], line["mono"])  # a drain's start, else its exit
    open_runs = [r for job_runs in runs.values() for r in job_runs]
    for pid, start in started.items():
        if start >= returned or until.get(pid, float("inf")) <= returned:
            continue
        # Until when it could start nothing: its slots all held by runs begun before the
        # return (the first of them to end frees one) ...
        ends = sorted(
            float("inf") if r.end is None else r.end
            for r in open_runs
            if r.pid == pid and r.start < returned and (r.end is None or r.end > returned)
        )
        free_at = returned if len(ends) < slots else ends[len(ends) - slots]
        # ... or cut off by a partition of it, or by a fault that holds every worker back
        # (the next outage, a storm of terminated sessions, a lock on procrastinate_jobs),
        # that began before it had a bound of free time: busy, then cut off, is not stuck.
        for w in sorted(
            (
                w
                for w in windows
                if (w.kind == "partition" and w.worker == index[pid])
                or (
                    _holds_every_worker(w) and (w.kind not in DATABASE_FAULTS or w.start > returned)
                )
            ),
            key=lambda w: w.start,
        ):
            if w.start < free_at + RESTART_BOUND_SECONDS and w.end > free_at:
                free_at = w.end
        # Free (nor draining, nor gone) from a bound before the start on: it was idle.
        if free_at < min(first_start - RESTART_BOUND_SECONDS, until.get(pid, float("inf"))):
            return False
    return True


def _check_liveness(report, history, final, windows, runs) -> None:
    quiet = next((line for line in history if line["type"] == "quiet"), None)
    if quiet is None or quiet.get("seconds") is None:
        report.violate(
            f"L1 not quiet within {QUIET_BOUND_SECONDS:.0f} s of the last fault",
            unfinished=final["unfinished"],
        )
    else:
        report.measures["quiet_seconds"] = round(quiet["seconds"], 1)
    for name, rows in final["liveness"].items():
        report.violate(f"liveness {name}", rows=rows)
    returns = [line for line in history if line["type"] == "database" and line["event"] == "up"]
    measured = []
    excused: list[dict[str, Any]] = []
    for line, restart in zip(returns, final["restarts"], strict=False):
        seconds = restart["seconds"]
        measured.append(None if seconds is None else round(seconds, 2))
        if seconds is None or seconds <= RESTART_BOUND_SECONDS or not restart.get("jobs"):
            continue
        if line.get("after", 0.0) >= max(
            _running_windows(history, line["mono"]), default=OUTAGE_WINDOW_SECONDS
        ):
            continue  # every worker then running had given up: started afresh
        returned = line["mono"]
        # Only a fault that held every worker back within the bound excuses a late start: one
        # that began after the bound had passed came too late to be the reason.
        bound = returned + RESTART_BOUND_SECONDS
        stopped_all = [
            w.kind
            for w in windows
            if w.start <= bound
            and w.end > returned
            and (
                # the next outage, a storm, a lock on procrastinate_jobs
                _holds_every_worker(w) and (w.kind not in DATABASE_FAULTS or w.start > returned)
            )
        ]
        if stopped_all:
            excused.append({"seconds": round(seconds, 2), "by": sorted(set(stopped_all))})
        elif _slots_held(history, runs, windows, returned, seconds):
            excused.append({"seconds": round(seconds, 2), "by": ["every slot busy"]})
        else:
            report.violate(
                f"L2 jobs started {seconds:.1f} s after the database returned "
                f"(bound {RESTART_BOUND_SECONDS:.0f} s)",
                returned_at=returned,
                waiting=restart["jobs"],
                outage=line.get("after"),
            )
    report.measures["restart_seconds"] = measured
    report.measures["late_restarts_excused"] = excused
    report.measures["restart_seconds_max"] = max(
        (m for m in measured if m is not None), default=None
    )
    down = [(w.start, w.end) for w in windows if w.kind in DATABASE_FAULTS]
    window_of = outage_windows(history)
    unreachable_exits = []
    for line in history:
        if line["type"] != "worker" or line["event"] != "exit" or line.get("expected"):
            continue
        when = line["mono"]
        cut_off = [(start, end) for start, end in down] + [
            (w.start, w.end)
            for w in windows
            if w.kind == "partition" and w.worker == line["worker"]
        ]
        away = [
            (start, end)
            for start, end in _merged(cut_off, gap=EXIT_GRACE_SECONDS)
            if start <= when <= end + EXIT_GRACE_SECONDS
        ]
        if away:
            # Within the outage window a worker may give up; how soon it did is measured,
            # from when it was cut off without a break (a partition, then an outage).
            since = away[0][0]
            unreachable_exits.append(round(when - since, 1))
            window = window_of.get(line["pid"], OUTAGE_WINDOW_SECONDS)
            if when - since < window - WINDOW_SLACK_SECONDS:
                report.violate(
                    "L3 a worker gave up sooner than its outage window",
                    worker=line["worker"],
                    pid=line["pid"],
                    code=line["code"],
                    away_seconds=round(when - since, 1),
                    outage_window=window,
                )
            continue
        report.violate(
            "L3 a worker exited on its own while the database was reachable",
            worker=line["worker"],
            pid=line["pid"],
            code=line["code"],
        )
    report.measures["exits_while_unreachable_after_seconds"] = unreachable_exits
    logged = [line for line in history if line["type"] == "worker_log"]
    report.measures["pruned_workers"] = sum(
        len(line["ids"]) for line in logged if line["event"] == "pruned"
    )
    report.measures["registered_again"] = sum(
        1 for line in logged if line["event"] == "registered_again"
    )
    _check_registrations(report, logged)


def _check_registrations(report: Report, logged: list[dict[str, Any]]) -> None:
    """L5: a worker registers again only once its row was pruned (a prune some worker
    logged); one that registers again with its row still there leaves that row behind, a
    worker nobody runs. The logs' order is not weighed: the pruning worker logs after its
    commit, and the pruned one may notice, register and log first."""
    pruned = {i for line in logged if line["event"] == "pruned" for i in line["ids"]}
    for line in logged:
        if line["event"] == "registered_again" and line["old"] not in pruned:
            report.violate(
                "L5 a worker registered again although its row was not pruned",
                worker=line["worker"],
                pid=line["pid"],
                old=line["old"],
                new=line["new"],
            )


def _rolled(window: Window, worker: int | None) -> bool:
    """Whether the rolling fault ``window`` (a deploy, a settings change) drained
    ``worker``: its outcome lists the workers it rolled; one still open at the end (or
    without that list) may have drained any."""
    outcome = window.detail.get("outcome")
    rolled = outcome.get("rolled") if isinstance(outcome, dict) else None
    if rolled is None:
        return True
    return any(entry.get("worker") == worker for entry in rolled)


def _merged(spans: list[tuple[float, float]], *, gap: float) -> list[tuple[float, float]]:
    """``spans`` (start, end) merged where one begins within ``gap`` of the last's end: a
    worker cut off by one fault and then another, with no time to get an answer between,
    was cut off for both."""
    merged: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1] + gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def _explains_failed_fetches(window: Window, worker: int) -> tuple[float, float] | None:
    """When ``window`` could make ``worker``'s fetches fail, or None."""
    if _holds_every_worker(window):
        return window.start, window.end
    if window.kind in ("partition", "reset") and window.worker == worker:
        return window.start, window.end
    if window.kind == "deploy":
        outcome = window.detail.get("outcome")
        seconds = outcome.get("migration_seconds") if isinstance(outcome, dict) else None
        if seconds is not None:
            return window.start, window.start + seconds
    return None


#: Failed fetches of one worker process outside every explaining fault (and the bound
#: after it) that make it stuck even when each stretch of them is short: a worker that
#: fails now and then (some of its pooled connections broken) is not healthy either.
UNEXPLAINED_FETCH_FAILURES = 5


def _uncovered(start: float, end: float, spans: list[tuple[float, float]]) -> float:
    """The longest stretch of ``[start, end]`` no span covers."""
    longest, at = 0.0, start
    for span_start, span_end in sorted(spans):
        if span_end <= at:
            continue
        if span_start >= end:
            break
        longest = max(longest, min(span_start, end) - at)
        at = max(at, span_end)
    return max(longest, end - at)


def _check_fetching(report, history, windows) -> None:
    failures: dict[int, list[dict]] = defaultdict(list)
    for line in history:
        if line["type"] == "fetch_failing":
            failures[line["pid"]].append(line)
    longest = 0.0
    for lines in failures.values():
        worker = lines[0]["worker"]
        spans = [span for w in windows if (span := _explains_failed_fetches(w, worker))]
        # A stretch of failing fetches: each attempt after the first of its stretch.
        stretches: list[list[dict]] = []
        for line in lines:
            if not stretches or line["attempt"] <= stretches[-1][-1]["attempt"]:
                stretches.append([])
            stretches[-1].append(line)
        for stretch in stretches:
            first, last = stretch[0], stretch[-1]
            began = first["mono"] - first["failing_seconds"]
            unexplained = _uncovered(began, last["mono"], spans)
            longest = max(longest, unexplained)
            if unexplained >= RESTART_BOUND_SECONDS:
                report.violate(
                    f"L4 a worker's fetches failed for {unexplained:.1f} s with no fault "
                    f"that explains it (bound {RESTART_BOUND_SECONDS:.0f} s)",
                    worker=worker,
                    pid=first["pid"],
                    attempts=last["attempt"],
                    error=last["error"],
                )
        unexplained_lines = [
            line
            for line in lines
            if not any(s <= line["mono"] <= e + RESTART_BOUND_SECONDS for s, e in spans)
        ]
        if len(unexplained_lines) >= UNEXPLAINED_FETCH_FAILURES:
            report.violate(
                f"L4 a worker's fetches failed {len(unexplained_lines)} times with no fault "
                f"that explains them (at most {UNEXPLAINED_FETCH_FAILURES - 1})",
                worker=worker,
                pid=lines[0]["pid"],
                error=unexplained_lines[-1]["error"],
            )
    report.measures["fetch_unexplained_seconds_max"] = round(longest, 1)


def main(argv: list[str]) -> int:
    """``python -m tests.nemesis.checker HISTORY``: judge a recorded history again."""
    if len(argv) != 1:
        print("usage: python -m tests.nemesis.checker HISTORY.jsonl")
        return 2
    report = check(read_history(Path(argv[0])))
    print(json.dumps(report.measures, indent=2, default=str))
    for violation in report.violations:
        print("- " + json.dumps(violation, default=str)[:1000])
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
