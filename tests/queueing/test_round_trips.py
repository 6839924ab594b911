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
