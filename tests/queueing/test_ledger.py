from __future__ import annotations

import pytest
from django.db import connection

from queueing.exceptions import LeaseLost
from queueing.ledger import Ledger, Outcome
from tests.conftest import run_concurrently
from tests.queueing.models import Step

LEDGER = Ledger(model=Step, key_fields=("unit", "stage"), lease_seconds=60)

pytestmark = pytest.mark.django_db(transaction=True)


def expire_lease(unit: str, stage: str) -> None:
    """Time travel: the holder's lease ran out a second ago."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE test_steps SET lease_expires_at = now() - interval '1 second' "
            "WHERE unit = %s AND stage = %s",
            [unit, stage],
        )


def test_first_claim_inserts_a_running_row_with_token_one():
    claim = LEDGER.claim(unit="u1", stage="extract", input_hash="h1")
    assert claim.outcome is Outcome.CLAIMED and claim.token == 1
    row = Step.objects.get(pk=claim.entry_id)
    assert (row.status, row.attempts, row.input_hash) == ("running", 1, "h1")
    assert row.lease_expires_at is not None


def test_sixteen_concurrent_claimers_one_claims_the_rest_are_busy():
    results = run_concurrently(lambda i: LEDGER.claim(unit="u2", stage="extract"), 16)
    assert not [r for r in results if isinstance(r, BaseException)], results
    outcomes = sorted(r.outcome for r in results)
    assert outcomes.count(Outcome.CLAIMED) == 1
    assert outcomes.count(Outcome.BUSY) == 15
    assert Step.objects.filter(unit="u2").count() == 1


def test_after_success_every_claim_is_done_and_the_row_never_changes():
    claim = LEDGER.claim(unit="u3", stage="extract")
    LEDGER.complete(claim)
    before = Step.objects.values().get(pk=claim.entry_id)
    results = run_concurrently(lambda i: LEDGER.claim(unit="u3", stage="extract"), 8)
    assert {r.outcome for r in results} == {Outcome.DONE}
    assert Step.objects.values().get(pk=claim.entry_id) == before


def test_expired_lease_is_reclaimed_and_the_old_holder_is_fenced_off():
    old = LEDGER.claim(unit="u4", stage="extract")
    assert LEDGER.claim(unit="u4", stage="extract").outcome is Outcome.BUSY
    expire_lease("u4", "extract")
    new = LEDGER.claim(unit="u4", stage="extract")
    assert new.outcome is Outcome.CLAIMED and new.token == old.token + 1
    with pytest.raises(LeaseLost):
        LEDGER.complete(old)
    with pytest.raises(LeaseLost):
        LEDGER.fail(old, error="late")
    LEDGER.complete(new)
    assert Step.objects.get(pk=new.entry_id).status == "success"


def test_failed_row_stays_claimable_and_keeps_the_error():
    claim = LEDGER.claim(unit="u5", stage="extract")
    LEDGER.fail(claim, error="parser exploded")
    row = Step.objects.get(pk=claim.entry_id)
    assert (row.status, row.error) == ("failed", "parser exploded")
    retry = LEDGER.claim(unit="u5", stage="extract")
    assert retry.outcome is Outcome.CLAIMED and retry.token == 2
    assert Step.objects.get(pk=claim.entry_id).error == ""


def test_stages_of_one_unit_are_independent():
    a = LEDGER.claim(unit="u6", stage="intake")
    b = LEDGER.claim(unit="u6", stage="extract")
    assert a.claimed and b.claimed and a.entry_id != b.entry_id


def test_claim_needs_exactly_the_key_fields():
    with pytest.raises(TypeError, match="key fields"):
        LEDGER.claim(unit="u7")


def test_closing_an_unclaimed_result_is_refused():
    LEDGER.complete(first := LEDGER.claim(unit="u8", stage="s"))
    done = LEDGER.claim(unit="u8", stage="s")
    assert first.claimed and done.outcome is Outcome.DONE
    with pytest.raises(LeaseLost):
        LEDGER.complete(done)
