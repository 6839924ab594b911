"""The recorded history of a nemesis run: one JSON object per line.

Every line has ``type`` (``run``, ``op``, ``fault``, ``worker``, ``effect``, ``final``,
``check``), ``mono`` (``time.monotonic()``, one clock for every process of the host) and
``wall``. Client operations and faults have a ``phase``: ``invoke`` then ``ok``, ``fail``
(it did not happen) or ``info`` (unknown: the database went away during it), as Jepsen
records them. The workers' effects are merged in at the end of the run
(:mod:`tests.nemesis.effects`).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from pathlib import Path
from typing import Any


class History:
    """Append-only, thread-safe; each line is flushed as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle = open(path, "a", buffering=1)  # noqa: SIM115 - closed by close()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def record(self, type_: str, **fields: Any) -> dict[str, Any]:
        line = {"type": type_, "mono": time.monotonic(), "wall": time.time(), **fields}
        with self._lock:
            self._handle.write(json.dumps(line, default=str) + "\n")
        return line

    def record_line(self, line: dict[str, Any]) -> None:
        """Append a line made elsewhere (a worker's effect), as it is."""
        with self._lock:
            self._handle.write(json.dumps(line, default=str) + "\n")

    def next_id(self) -> int:
        return next(self._ids)

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def read_history(path: Path) -> list[dict[str, Any]]:
    """Every line of a history, ordered by ``mono``."""
    lines = [json.loads(text) for text in path.read_text().splitlines() if text.strip()]
    return sorted(lines, key=lambda line: line["mono"])
