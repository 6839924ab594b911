"""Credits: every admitted job is charged once and refunded at most once, a refused
admission charges nothing, no balance goes negative — with admitters, two promoters, two
workers and the clock racing each other."""

from __future__ import annotations

import pytest

from tests.runs.factories import funded_user
from tests.runs.scenarios import GRANT, Scenario, assert_credit_invariant


@pytest.mark.django_db(transaction=True)
def test_credit_invariant_with_two_promoters_and_two_workers_in_process(settings, clean_queue):
    settings.RUNS_CORE_CLIENT = "tests.runs.fakes.FlakyCore"
    users = [funded_user(credits=GRANT) for _ in range(3)]
    scenario = Scenario(users, workers=2)

    results = scenario.run()

    assert scenario.violations == []
    assert_credit_invariant(users, results[3 + 2 :])
