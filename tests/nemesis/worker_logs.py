"""What the workers' logs tell the checker: each failed fetch, as a history line.

A worker that cannot fetch jobs logs each failed attempt (``queueing.outage``: "database
error while fetching jobs (attempt N, failing for S s): …", or "database unreachable"
when it cannot connect). The database's faults explain such failures; a worker that
keeps failing with the database up (a plan gone stale, a pool that lends dead
connections) is stuck while it looks alive. The runner adds these lines to the history
after the run (``fetch_failing``); the checker's L4 judges them.
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
        wall = time.mktime(time.strptime(match["at"], "%Y-%m-%d %H:%M:%S"))
        wall += int(match["ms"]) / 1000
        found.append((wall, int(match["attempt"]), float(match["failing"]), match["error"]))
    return found


def fetch_failing_lines(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A ``fetch_failing`` history line for each failed fetch in the logs of the workers
    the history started, on the history's monotonic clock."""
    if not history:
        return []
    offset = history[0]["wall"] - history[0]["mono"]
    lines = []
    for start in history:
        if start["type"] != "worker" or start["event"] != "start" or not start.get("log"):
            continue
        log = Path(start["log"])
        if not log.exists():
            continue
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
