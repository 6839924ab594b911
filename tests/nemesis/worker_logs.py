"""What the workers' logs tell the checker: each failed fetch, as a history line.

A worker that cannot fetch jobs logs each failed attempt (``queueing.outage``: "database
error while fetching jobs (attempt N, failing for S s): …", or "database unreachable"
when it cannot connect). The database's faults explain such failures; a worker that
keeps failing with the database up (a plan gone stale, a pool that lends dead
connections) is stuck while it looks alive. The runner adds these lines to the history
after the run (``fetch_failing``); the checker's L4 judges them.

The logs also say when a starting worker pruned the rows of workers silent past its
window ("pruned dead workers: …"), and when a worker found its own row pruned and
registered again ("… registered again as …"): ``worker_log`` lines, which the checker
counts.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

FAILED_FETCH = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) (?:ERROR|WARNING) queueing\.worker: "
    r"database (?:error|unreachable) while fetching jobs \(attempt (?P<attempt>\d+), "
    r"failing for (?P<failing>\d+) s\): (?P<error>.*?)(?:; next attempt in [\d.]+ s)?$"
)


_STAMP = r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(?P<ms>\d{3}) \w+ queueing\.worker: "
PRUNED = re.compile(_STAMP + r"pruned dead workers: (?P<ids>[\d, ]+)$")
REGISTERED_AGAIN = re.compile(
    _STAMP + r"worker (?P<old>\d+) was pruned while cut off from the database; registered "
    r"again as (?P<new>\d+) and took back (?P<adopted>\d+) running job"
)


def _wall(match: re.Match[str]) -> float:
    return time.mktime(time.strptime(match["at"], "%Y-%m-%d %H:%M:%S")) + int(match["ms"]) / 1000


def failed_fetches(text: str) -> list[tuple[float, int, float, str]]:
    """``(wall time, attempt, seconds failing, error)`` of each failed fetch in a worker's
    plain-format log (the cluster pins ``LOG_FORMAT=plain``). Its timestamps are local
    time in the worker's time zone, which Django's setup sets (``TIME_ZONE``) in the
    workers and in the runner alike, so ``time.mktime`` here reads them back."""
    found = []
    for line in text.splitlines():
        match = FAILED_FETCH.match(line)
        if match is None:
            continue
        found.append((_wall(match), int(match["attempt"]), float(match["failing"]), match["error"]))
    return found


def pruning_lines(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ``worker_log`` line for each prune (``pruned``, the ids) and each registration
    after a prune (``registered_again``) in the logs of the workers the history started."""
    if not history:
        return []
    offset = history[0]["wall"] - history[0]["mono"]
    lines = []
    for start in _starts(history):
        for text_line in Path(start["log"]).read_text(errors="replace").splitlines():
            if match := PRUNED.match(text_line):
                fields = {"event": "pruned", "ids": [int(i) for i in match["ids"].split(",")]}
            elif match := REGISTERED_AGAIN.match(text_line):
                fields = {
                    "event": "registered_again",
                    "old": int(match["old"]),
                    "new": int(match["new"]),
                    "adopted": int(match["adopted"]),
                }
            else:
                continue
            wall = _wall(match)
            lines.append(
                {
                    "type": "worker_log",
                    "mono": wall - offset,
                    "wall": wall,
                    "worker": start["worker"],
                    "pid": start["pid"],
                    **fields,
                }
            )
    return sorted(lines, key=lambda line: line["mono"])


def _starts(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history's worker start lines whose log exists."""
    return [
        line
        for line in history
        if line["type"] == "worker"
        and line["event"] == "start"
        and line.get("log")
        and Path(line["log"]).exists()
    ]


def fetch_failing_lines(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ``fetch_failing`` history line for each failed fetch in the logs of the workers
    the history started, on the history's monotonic clock."""
    if not history:
        return []
    offset = history[0]["wall"] - history[0]["mono"]
    lines = []
    for start in _starts(history):
        log = Path(start["log"])
        for wall, attempt, failing, error in failed_fetches(log.read_text(errors="replace")):
            lines.append(
                {
                    "type": "fetch_failing",
                    "mono": wall - offset,
                    "wall": wall,
                    "worker": start["worker"],
                    "pid": start["pid"],
                    "attempt": attempt,
                    "failing_seconds": failing,
                    "error": error[:300],
                }
            )
    return sorted(lines, key=lambda line: line["mono"])
