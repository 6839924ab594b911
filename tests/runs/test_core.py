"""The local core service: synchronous checks at create, the daily budget under
concurrency, and the held → released → judging → done/failed state machine."""

from __future__ import annotations

import uuid

import pytest

from runs.core import LocalCore, get_core, validate_sources
from runs.exceptions import (
    BudgetExhausted,
    CoreStateError,
    CoreUnavailable,
    InvalidDoi,
    NoSources,
)
from runs.models import CoreDailyUsage, CoreRun, CoreRunState
from tests.conftest import run_concurrently
from tests.factories import UserFactory


@pytest.mark.parametrize(
    "doi", ["10.1000/xyz123", "10.1038/nphys1170", "10.12345/a.b-c_(d)", None, ""]
)
def test_well_formed_or_absent_dois_pass(doi):
    assert validate_sources([{"key": "s", "doi": doi}]) == [{"key": "s", "doi": doi or None}]


@pytest.mark.parametrize(
    "doi", ["10.10/x", "doi:10.1000/x", "10.1000", "11.1000/x", "10.1000/with space"]
)
def test_malformed_dois_are_refused_naming_the_source(doi):
    with pytest.raises(InvalidDoi, match="'s'"):
        validate_sources([{"key": "s", "doi": doi}])


def test_a_run_needs_a_source():
    with pytest.raises(NoSources):
        validate_sources([])


@pytest.mark.django_db
def test_state_machine_moves_forward_idempotently_and_refuses_skips():
    core = get_core()
    run_id = core.create_held(run_id=uuid.uuid4(), user_id=UserFactory().pk, sources=[{"key": "s"}])
    state = lambda: CoreRun.objects.get(pk=run_id).state  # noqa: E731

    with pytest.raises(CoreStateError):
        core.finish(core_run_id=run_id, ok=True)
    assert state() == CoreRunState.HELD
    core.release(core_run_id=run_id)
    core.release(core_run_id=run_id)
    assert state() == CoreRunState.RELEASED
    core.start(core_run_id=run_id)
    core.start(core_run_id=run_id)
    assert state() == CoreRunState.JUDGING
    core.finish(core_run_id=run_id, ok=True)
    core.finish(core_run_id=run_id, ok=True)
    assert state() == CoreRunState.DONE
    with pytest.raises(CoreStateError):
        core.finish(core_run_id=run_id, ok=False)


@pytest.mark.django_db
def test_an_unavailable_core_refuses_every_call(settings):
    core = LocalCore()
    run_id = core.create_held(run_id=uuid.uuid4(), user_id=UserFactory().pk, sources=[{"key": "s"}])
    settings.CORE_AVAILABLE = False

    for call in (
        lambda: core.release(core_run_id=run_id),
        lambda: core.create_held(run_id=uuid.uuid4(), user_id=1, sources=[{"key": "s"}]),
    ):
        with pytest.raises(CoreUnavailable):
            call()


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_never_exceed_the_daily_budget(settings):
    settings.CORE_DAILY_BUDGET = 7
    user = UserFactory()

    results = run_concurrently(
        lambda i: LocalCore().create_held(
            run_id=uuid.uuid4(), user_id=user.pk, sources=[{"key": "s"}]
        ),
        20,
    )

    assert len([r for r in results if isinstance(r, int)]) == 7
    assert all(isinstance(r, BudgetExhausted) for r in results if not isinstance(r, int))
    assert CoreRun.objects.count() == 7
    assert CoreDailyUsage.objects.get().used == 7


@pytest.mark.django_db
def test_a_zero_budget_is_no_bound_and_still_counts(settings):
    settings.CORE_DAILY_BUDGET = 0
    user = UserFactory()

    for _ in range(3):
        LocalCore().create_held(run_id=uuid.uuid4(), user_id=user.pk, sources=[{"key": "s"}])

    assert CoreRun.objects.count() == 3
    assert CoreDailyUsage.objects.get().used == 3


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("step", ["give_back", "fail_released"])
def test_a_best_effort_core_step_never_hides_a_lost_database_connection(step):
    """The give-back of a held run (and the failing of a released one) is best effort:
    an unreachable core is logged and left to the resume tick. A lost connection of this
    process is no such failure: nothing of the caller's transaction will commit, so it
    must reach the caller (a sweep then counts the row failed instead of changed)."""
    import psycopg
    from django.db import OperationalError, connection, transaction

    from runs.core import held_run_give_back, released_run_fail
    from tests.conftest import database_url

    core = LocalCore()
    user = UserFactory()
    run = core.create_held(
        user_id=user.pk, sources=[{"key": "a", "title": "A"}], run_id=uuid.uuid4()
    )
    reached_the_caller = False
    with pytest.raises(OperationalError), transaction.atomic():
        pid = connection.cursor().connection.info.backend_pid
        with psycopg.connect(database_url(), autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        try:
            if step == "give_back":
                held_run_give_back(core_run_id=run)
            else:
                released_run_fail(core_run_id=run, detail="x")
        except OperationalError:
            reached_the_caller = True
            raise
    assert reached_the_caller
    connection.close()
