"""The outage window (``queueing.outage.Failures``) and the worker's last check before it
gives up (``PgstageWorker._give_up``).

Fault model — a worker must stop only when its database stayed out of reach for the whole
window (``QUEUEING_DATABASE_OUTAGE_SECONDS``):
- two outages with a short gap, one loop making no attempt in the gap while others get
  through: test_a_round_trip_of_any_loop_breaks_an_outage (before the fix: the loop's
  streak spanned both outages and the worker stopped;
  tests/acceptance/test_database_outage.py::
  test_an_outage_ending_at_the_window_never_stops_a_worker_whose_database_is_back
  reproduces it with a real server);
- a loop's attempt begun in the outage reports its failure after the database is back,
  before any round trip got through: test_the_worker_stops_only_if_its_own_round_trip_fails;
- a loop that fails with errors other than unreachable while others work still stops the
  worker: test_other_errors_are_not_excused_by_other_loops_round_trips;
- an outage ending just short of the window, or lasting exactly as long:
  test_an_outage_exactly_as_long_as_the_window_stops_the_worker.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from queueing import outage

REFUSED = psycopg.OperationalError("connection refused")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(outage.time, "monotonic", clock)
    return clock


def _failures(expired: list[str]) -> outage.Failures:
    return outage.Failures(window=4, on_expired=lambda reason, **_: expired.append(reason))


def test_a_round_trip_of_any_loop_breaks_an_outage(clock):
    expired: list[str] = []
    failures = _failures(expired)
    failures.failed("beating", REFUSED)
    clock.now += 2.5  # the first outage ends; the fetch loop gets through, the heartbeat
    failures.recovered("fetching jobs")  # makes no attempt before the second one begins
    clock.now += 0.5
    failures.failed("beating", REFUSED)
    clock.now += 1.5  # 4.5 s into the beat's streak, 2 s since the database answered
    failures.failed("beating", REFUSED)
    assert expired == [] and not failures.expired
    clock.now += 2.1  # 4.1 s without an answer
    failures.failed("beating", REFUSED)
    assert len(expired) == 1 and "while beating for 7 s" in expired[0]


def test_other_errors_are_not_excused_by_other_loops_round_trips(clock):
    expired: list[str] = []
    failures = _failures(expired)
    broken = psycopg.errors.UndefinedTable("relation does not exist")
    failures.failed("deferring periodic jobs", broken)
    clock.now += 3
    failures.recovered("beating")
    clock.now += 1.5
    failures.failed("deferring periodic jobs", broken)
    assert len(expired) == 1 and "it kept failing" in expired[0]


@pytest.mark.django_db(transaction=True)
def test_the_worker_stops_only_if_its_own_round_trip_fails(monkeypatch):
    from procrastinate.contrib.django import app

    from queueing import worker as worker_module
    from queueing.worker import PgstageWorker

    async def give_up(params: dict) -> PgstageWorker:
        worker = PgstageWorker(app=app, wait=True, listen_notify=False)
        monkeypatch.setattr(worker_module, "connector_params", lambda: params)
        worker.failures.expired = True
        worker._give_up("the database stayed unreachable while fetching", unreachable=True)
        await worker._probe
        return worker

    params = worker_module.connector_params()
    answered = asyncio.run(give_up(params))
    assert answered._gave_up is None and not answered.failures.expired
    closed = {**params, "host": "127.0.0.1", "port": 9, "connect_timeout": 1}
    away = asyncio.run(give_up(closed))
    assert away._gave_up == "the database stayed unreachable while fetching"


@pytest.mark.parametrize(("unanswered", "stops"), [(3.99, False), (4.0, True)])
def test_an_outage_exactly_as_long_as_the_window_stops_the_worker(clock, unanswered, stops):
    """The window is inclusive, to the instant: just short of it the loop goes on."""
    expired: list[str] = []
    failures = _failures(expired)
    failures.failed("fetching jobs", REFUSED)
    clock.now += unanswered
    failures.failed("fetching jobs", REFUSED)
    assert bool(expired) == stops
