"""Tasks whose worker log lines tests/queueing/test_logs.py reads."""

from __future__ import annotations

from queueing.app import task
from queueing.backoff import JitteredBackoff


@task(name="tests.logs.ok")
def ok(n: int) -> int:
    return n


@task(
    name="tests.logs.always_fails",
    retry=JitteredBackoff(max_attempts=2, base_seconds=0.01, cap_seconds=0.05),
)
def always_fails() -> None:
    raise ValueError("the input is broken")
