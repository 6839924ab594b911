"""The hot path is lean: enqueue, claim and complete are one statement each."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import Policy, enqueue
from queueing.ledger import Ledger
from tests.queueing.models import Step

LEDGER = Ledger(model=Step, key_fields=("unit", "stage"))

pytestmark = pytest.mark.django_db(transaction=True)


def statements(func) -> tuple[object, int]:
    with CaptureQueriesContext(connection) as captured:
        result = func()
    return result, len(captured)


def test_enqueue_is_one_statement_when_it_creates_and_when_it_dedups(clean_queue):
    created, n = statements(
        lambda: enqueue("tests.record", args={"label": "a"}, key="rt:1", policy=Policy.EXCLUSIVE)
    )
    assert created.created and n == 1
    dedup, n = statements(
        lambda: enqueue("tests.record", args={"label": "b"}, key="rt:1", policy=Policy.EXCLUSIVE)
    )
    assert not dedup.created and dedup.job_id == created.job_id and n == 1


def test_claim_and_complete_are_one_statement_each():
    claim, n = statements(lambda: LEDGER.claim(unit="rt", stage="s"))
    assert claim.claimed and n == 1
    _, n = statements(lambda: LEDGER.complete(claim))
    assert n == 1
    done, n = statements(lambda: LEDGER.claim(unit="rt", stage="s"))
    assert not done.claimed and n == 1


def test_complete_and_the_next_job_are_one_statement_and_both_or_neither(clean_queue):
    from queueing.enqueue import job_params
    from queueing.exceptions import LeaseLost
    from tests.conftest import jobs

    def next_job(unit: str) -> dict:
        return job_params(
            "tests.record", args={"label": unit}, key=f"next:{unit}", policy=Policy.EXCLUSIVE
        )

    claim = LEDGER.claim(unit="rt2", stage="s")
    _, n = statements(lambda: LEDGER.complete(claim, then=next_job("a")))
    assert n == 1
    assert [j["queueing_lock"] for j in jobs()] == ["exclusive/next:a"]

    # A job already holding the key is left as it is: no error, no second job.
    again = LEDGER.claim(unit="rt3", stage="s")
    LEDGER.complete(again, then=next_job("a"))
    assert len(jobs()) == 1

    # A stale token closes nothing and enqueues nothing.
    stale = LEDGER.claim(unit="rt4", stage="s")
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE test_steps SET attempts = attempts + 1 WHERE id = %s", [stale.entry_id]
        )
    with pytest.raises(LeaseLost):
        LEDGER.complete(stale, then=next_job("b"))
    assert len(jobs()) == 1
