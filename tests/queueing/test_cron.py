"""Sweep cadences in words (queueing.cron): each shape is checked against croniter, which
procrastinate schedules with, so a sentence never says something the cron does not do."""

from __future__ import annotations

import datetime
import itertools

import pytest
from croniter import croniter

from queueing.cron import describe_cron
from queueing.sweeps import sweeps

START = datetime.datetime(2026, 1, 1, 0, 0, 0)

CASES = [
    ("* * * * *", "every minute", 60),
    ("*/5 * * * *", "every 5 minutes", 300),
    ("*/10 * * * *", "every 10 minutes", 600),
    ("* * * * * */30", "every 30 seconds", 30),
    ("* * * * * *", "every second", 1),
    ("* * * * * */5", "every 5 seconds", 5),
    ("* * * * * 30", "every minute at second 30", 60),
    ("*/5 * * * * 30", "every 5 minutes at second 30", 300),
    ("17 * * * *", "every hour at minute 17", 3600),
    ("0 * * * *", "every hour at minute 0", 3600),
    ("17 * * * * 5", "every hour at minute 17, second 5", 3600),
    ("0 */6 * * *", "every 6 hours at minute 0", 6 * 3600),
    ("30 3 * * *", "every day at 03:30", 86400),
    ("30 3 * * * 15", "every day at 03:30:15", 86400),
]


@pytest.mark.parametrize(("cron", "words", "period"), CASES)
def test_a_cadence_is_a_sentence_that_croniter_agrees_with(cron, words, period):
    assert describe_cron(cron) == words
    runs = croniter(cron, START)
    times = [runs.get_next(datetime.datetime) for _ in range(4)]
    assert {(b - a).total_seconds() for a, b in itertools.pairwise(times)} == {period}


@pytest.mark.parametrize(
    "cron",
    [
        "* * * * 1",  # Mondays
        "0 0 1 * *",  # monthly
        "* * * * * */7",  # 0, 7 … 56, then 0: not evenly spaced
        "*/7 * * * *",
        "1,2 * * * *",
        "5-10 * * * *",
        "61 * * * *",
        "* 25 * * *",
        "@hourly",
        "* * * *",
        "* * * * * * *",
        "",
    ],
)
def test_any_other_shape_is_shown_as_the_cron_itself(cron):
    assert describe_cron(cron) == f"cron: {cron}"


def test_every_declared_sweep_has_a_cadence_in_words():
    for sweep in sweeps().values():
        assert not sweep.schedule.startswith("cron:"), sweep
        assert sweep.schedule.startswith("every "), sweep


def test_every_sweep_description_is_one_sentence_without_a_stray_comma():
    for sweep in sweeps().values():
        assert sweep.description.endswith("."), sweep.name
        assert not any(bad in sweep.description for bad in (",.", ", .", ",,")), sweep.name
