from __future__ import annotations

import datetime
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from procrastinate.jobs import Job

from queueing.backoff import JitteredBackoff, ceiling, delay, next_retry_at
from queueing.exceptions import DoNotRetry, RetryLater

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

attempts = st.integers(min_value=0, max_value=10_000)
bases = st.floats(min_value=0, max_value=3600, allow_nan=False, allow_infinity=False)
caps = st.floats(min_value=0, max_value=86_400, allow_nan=False, allow_infinity=False)
seeds = st.integers(min_value=0, max_value=2**32)


@given(attempt=attempts, base=bases, cap=caps, seed=seeds)
def test_every_delay_is_within_zero_and_cap(attempt, base, cap, seed):
    d = delay(attempt, base=base, cap=cap, rng=random.Random(seed))
    assert 0 <= d <= cap
    assert d <= ceiling(attempt, base=base, cap=cap)


@given(
    attempt=attempts,
    base=bases,
    cap=caps,
    seed=seeds,
    window=st.floats(min_value=-3600, max_value=7200, allow_nan=False),
)
def test_never_past_the_deadline(attempt, base, cap, seed, window):
    deadline = NOW + datetime.timedelta(seconds=window)
    at = next_retry_at(
        attempt, now=NOW, base=base, cap=cap, rng=random.Random(seed), deadline=deadline
    )
    if deadline <= NOW:
        assert at is None
    else:
        assert at is not None and NOW <= at <= deadline


@given(base=st.floats(min_value=0.001, max_value=10), cap=st.floats(min_value=10, max_value=1e4))
def test_ceiling_doubles_until_the_cap(base, cap):
    values = [ceiling(n, base=base, cap=cap) for n in range(40)]
    assert values == sorted(values)
    assert values[-1] == cap


def test_jitter_spreads_delays():
    rng = random.Random(7)
    samples = [delay(5, base=1, cap=300, rng=rng) for _ in range(500)]
    assert min(samples) < 4 and max(samples) > 28  # uniform over [0, 32]


def job(attempts: int) -> Job:
    return Job(id=1, queue="q", lock=None, queueing_lock=None, task_name="t", attempts=attempts)


def test_strategy_retries_with_capped_jitter_then_gives_up():
    strategy = JitteredBackoff(
        max_attempts=3, base_seconds=10, cap_seconds=15, rng=random.Random(1)
    )
    decision = strategy.get_retry_decision(exception=ValueError(), job=job(0))
    assert decision is not None
    now = datetime.datetime.now(datetime.UTC)
    assert decision.retry_at <= now + datetime.timedelta(seconds=15)
    assert strategy.get_retry_decision(exception=ValueError(), job=job(2)) is None


def test_strategy_honours_a_deadline_beyond_max_attempts():
    strategy = JitteredBackoff(max_attempts=2, rng=random.Random(1))
    future = datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=10)
    decision = strategy.get_retry_decision(
        exception=RetryLater("core down", deadline=future), job=job(30)
    )
    assert decision is not None and decision.retry_at <= future
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    assert (
        strategy.get_retry_decision(exception=RetryLater("core down", deadline=past), job=job(0))
        is None
    )


def test_do_not_retry_fails_at_once():
    assert JitteredBackoff().get_retry_decision(exception=DoNotRetry("no"), job=job(0)) is None


def test_negative_inputs_are_refused():
    with pytest.raises(ValueError):
        ceiling(-1, base=1, cap=1)
