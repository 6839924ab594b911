"""Capped exponential backoff with full jitter, a give-up deadline, and the retry
strategy every pgstage task uses by default.

Pure functions (``delay``, ``next_retry_at``) take their randomness and clock as
arguments, so property tests can pin them down. "Full jitter" (AWS Architecture Blog,
"Exponential Backoff And Jitter"): the delay is uniform in ``[0, min(cap, base·2^n)]``,
which spreads a thundering herd of retries evenly instead of in synchronized waves.
"""

from __future__ import annotations

import datetime
import random
from dataclasses import dataclass, field

from procrastinate.jobs import Job
from procrastinate.retry import BaseRetryStrategy, RetryDecision

from queueing.exceptions import DoNotRetry, RetryLater

__all__ = ["DEFAULT_RETRY", "JitteredBackoff", "retry_from_settings"]


def ceiling(attempt: int, *, base: float, cap: float) -> float:
    """The largest delay for ``attempt`` (0-based): ``min(cap, base·2^attempt)``."""
    if attempt < 0 or base < 0 or cap < 0:
        raise ValueError("attempt, base and cap must be >= 0")
    # Compare exponents, not values, so a large attempt cannot overflow a float.
    if attempt >= 64 or base * (2.0**attempt) >= cap:
        return cap
    return base * (2.0**attempt)


def delay(attempt: int, *, base: float, cap: float, rng: random.Random) -> float:
    """A full-jitter delay in seconds: uniform in ``[0, ceiling(attempt)]``, never above cap."""
    return min(cap, rng.uniform(0.0, ceiling(attempt, base=base, cap=cap)))


def next_retry_at(
    attempt: int,
    *,
    now: datetime.datetime,
    base: float,
    cap: float,
    rng: random.Random,
    deadline: datetime.datetime | None = None,
) -> datetime.datetime | None:
    """When to retry after ``attempt`` failed attempts, or None to give up.

    Never later than ``deadline``: once ``now`` has reached it there is no retry; a delay
    that would overshoot it is shortened to land on it (one last try at the deadline).
    """
    if deadline is not None and now >= deadline:
        return None
    at = now + datetime.timedelta(seconds=delay(attempt, base=base, cap=cap, rng=rng))
    if deadline is not None and at > deadline:
        return deadline
    return at


@dataclass(kw_only=True)
class JitteredBackoff(BaseRetryStrategy):
    """procrastinate retry strategy: capped, fully jittered, bounded by ``max_attempts``
    (counting the first run) or, for :class:`RetryLater` with a deadline, by that deadline.
    :class:`DoNotRetry` fails the job at once."""

    max_attempts: int = 8
    base_seconds: float = 2.0
    cap_seconds: float = 300.0
    rng: random.Random = field(default_factory=random.SystemRandom)

    def get_retry_decision(self, *, exception: BaseException, job: Job) -> RetryDecision | None:
        if isinstance(exception, DoNotRetry):
            return None
        now = datetime.datetime.now(datetime.UTC)
        deadline = exception.deadline if isinstance(exception, RetryLater) else None
        if deadline is None and job.attempts + 1 >= self.max_attempts:
            return None
        at = next_retry_at(
            job.attempts,
            now=now,
            base=self.base_seconds,
            cap=self.cap_seconds,
            rng=self.rng,
            deadline=deadline,
        )
        return None if at is None else RetryDecision(retry_at=at)


def retry_from_settings() -> JitteredBackoff:
    """The default strategy, tuned by ``QUEUEING_RETRY_MAX_ATTEMPTS``,
    ``QUEUEING_RETRY_BASE_SECONDS`` and ``QUEUEING_RETRY_CAP_SECONDS``."""
    from django.conf import settings

    return JitteredBackoff(
        max_attempts=int(getattr(settings, "QUEUEING_RETRY_MAX_ATTEMPTS", 8)),
        base_seconds=float(getattr(settings, "QUEUEING_RETRY_BASE_SECONDS", 2.0)),
        cap_seconds=float(getattr(settings, "QUEUEING_RETRY_CAP_SECONDS", 300.0)),
    )


DEFAULT_RETRY = retry_from_settings()
