"""Effects the generic nemesis tasks leave outside the database: append-only files.

One file per worker process (``effects-<pid>.jsonl`` under ``NEMESIS_EFFECTS_DIR``), one
JSON line per effect, written with ``O_APPEND`` and flushed at once, so a SIGKILL loses at
most the line being written. ``mono`` is ``time.monotonic()`` (one clock for every process
of the host, the runner's included), ``wall`` the wall clock.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

_handle = None


def log_effect(event: str, *, task: str, key: str, job_id: int | None) -> None:
    """Append one effect line (``start``, ``end``, ``error``, ``hook``) of this process."""
    global _handle
    if _handle is None:
        directory = Path(os.environ["NEMESIS_EFFECTS_DIR"])
        _handle = open(directory / f"effects-{os.getpid()}.jsonl", "a", buffering=1)  # noqa: SIM115
    line = {
        "type": "effect",
        "event": event,
        "task": task,
        "key": key,
        "job_id": job_id,
        "pid": os.getpid(),
        "mono": time.monotonic(),
        "wall": time.time(),
    }
    _handle.write(json.dumps(line) + "\n")


def read_effects(directory: Path) -> Iterator[dict]:
    """Every complete effect line under ``directory`` (a torn last line is skipped)."""
    for path in sorted(directory.glob("effects-*.jsonl")):
        for text in path.read_text().splitlines():
            try:
                yield json.loads(text)
            except json.JSONDecodeError:
                continue
