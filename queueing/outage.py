"""Failure windows for the worker's loops: back off, say so, and give up in time.

Each of the worker's loops (fetching, heart-beating, saving an outcome, deferring periodic
jobs, maintenance) reports its failures and successes under its own name. A failure
returns the delay before the next attempt (capped exponential backoff with full jitter)
and is logged as one line with that delay. A loop that has failed without a break for the
whole window gives the worker up: one loop's success never hides another's endless
failure (a heartbeat that works must not keep a worker alive whose fetch always fails).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

import psycopg

from queueing import backoff

logger = logging.getLogger("queueing.worker")

#: Backoff between attempts: full jitter from 0.5 s, growing to at most 10 s.
BASE_SECONDS = 0.5
CAP_SECONDS = 10.0
MIN_PAUSE_SECONDS = 0.05


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or the driver error it wraps) means the database is out of reach:
    a refused or lost connection, a shutdown, a pool with nothing to give."""
    cause = exc.__cause__ or exc
    return isinstance(cause, psycopg.OperationalError | psycopg.InterfaceError | OSError)


def describe(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    text = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


class Failures:
    """Per-loop failure windows, shared by one worker."""

    def __init__(self, *, window: float, on_expired: Callable[[str], None]):
        self.window = window
        self._on_expired = on_expired
        self._since: dict[str, float] = {}
        self._attempts: dict[str, int] = {}
        self._rng = random.SystemRandom()
        self.expired = False
        #: Bumped by every failure: job threads reconnect once when it moved.
        self.epoch = 0

    def failed(self, loop: str, exc: BaseException, *, bounded: bool = True) -> float:
        """Record a failed attempt of ``loop``; return the pause before the next one.
        ``bounded=False`` for a loop the worker can do without (LISTEN: polling remains)."""
        now = time.monotonic()
        self.epoch += 1
        since = self._since.setdefault(loop, now)
        attempt = self._attempts.get(loop, 0)
        self._attempts[loop] = attempt + 1
        elapsed = now - since
        unreachable = is_connection_error(exc)
        if bounded and elapsed >= self.window and not self.expired:
            self.expired = True
            trouble = "the database stayed unreachable" if unreachable else "it kept failing"
            self._on_expired(
                f"{trouble} while {loop} for {elapsed:.0f} s (the window is "
                f"{self.window:.0f} s, QUEUEING_DATABASE_OUTAGE_SECONDS); last error: "
                f"{describe(exc)}"
            )
        pause = max(
            MIN_PAUSE_SECONDS,
            backoff.delay(attempt, base=BASE_SECONDS, cap=CAP_SECONDS, rng=self._rng),
        )
        logger.log(
            logging.WARNING if unreachable else logging.ERROR,
            "%s while %s (attempt %d, failing for %.0f s): %s; next attempt in %.1f s",
            "database unreachable" if unreachable else "database error",
            loop,
            attempt + 1,
            elapsed,
            describe(exc),
            pause,
        )
        return pause

    def recovered(self, loop: str) -> None:
        since = self._since.pop(loop, None)
        if self._attempts.pop(loop, 0) and since is not None:
            logger.warning("%s works again after %.1f s", loop, time.monotonic() - since)
