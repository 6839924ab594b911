"""Admission races the per-user lock must close.

* Two delta re-checks of one user at once (two tabs, a double click, an operator's
  retry of a failed delta): a delta never waits for the slot, but its balance check and
  charge are the user's, so it takes the user's queue lock too — invariant 5, no balance
  goes negative.
* The resume tick's ``held_runs_expire`` while an admission whose core created its held
  run before the lock (a core that cannot join the admission's statement) waits for the
  user's lock: either the expiry skips the run (the admission's
  guard holds it) or the admission is refused cleanly (``HoldExpired``, 503) — never a
  job naming a deleted run (an IntegrityError at commit, a 500).
* An operator's retry of a failed delta while the user admits a newer delta of the same
  run: the retry's "still the run's newest?" check and its admission hold the user's
  lock together, so the user's delta comes after the retry's job (it stays the newest),
  never between the check and the retry's job.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from django.db import connection, connections, transaction

from queueing import locks
from runs import admission, operations, processing
from runs.core import LocalCore
from runs.exceptions import HoldExpired, InsufficientCredits, RunsError
from runs.models import AnalysisJob, CoreRun
from runs.queue import ANALYSIS_QUEUE_LOCK
from runs.selectors import credit_balance
from tests.conftest import database_url
from tests.runs.factories import DOC_HTML, SOURCES, funded_user

pytestmark = pytest.mark.django_db(transaction=True)


def admit(user, **kwargs):
    return admission.analysis_job_admit(
        user=user, title=kwargs.pop("title", "T"), doc_html=DOC_HTML, sources=SOURCES, **kwargs
    )


def in_thread(name: str, outcome: dict[str, object], call) -> threading.Thread:
    """Start ``call`` on a thread of its own (its own connection); its result, or what it
    raised, lands in ``outcome[name]``."""

    def run() -> None:
        try:
            outcome[name] = call()
        except BaseException as exc:
            outcome[name] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, name=name)
    thread.start()
    return thread


class HeldBeforeCore(LocalCore):
    """The local core as a core that cannot join the admission's statement (a remote
    one): its held run is created before the user's lock, in a commit of its own."""

    joins_admission = False


@pytest.fixture
def held_before(settings):
    settings.RUNS_CORE_CLIENT = f"{__name__}.HeldBeforeCore"


def waiting_on_locks() -> int:
    """Sessions of this database waiting for a lock (advisory, row or transaction)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def wait_for(condition, *, timeout: float = 20) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` passes (a generous deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def hold_the_users_lock(user_id: int) -> tuple[threading.Thread, threading.Event]:
    """Hold the user's queue lock in a session of its own until the event is set;
    returns (the holding thread, the event)."""
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                locks.xact_lock(ANALYSIS_QUEUE_LOCK, user_id)
                holding.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold, name="user-lock-holder")
    holder.start()
    assert holding.wait(timeout=20)
    return holder, release


class _Paused:
    """Set once a session of this database waits for a lock (polled from the caller's
    connection: a transaction sees pg_stat_activity as of its first read)."""

    def wait(self, timeout: float) -> bool:
        return wait_for(lambda: waiting_on_locks() > 0, timeout=timeout)


def pause_before_commit(tenant_id: int) -> tuple[_Paused, threading.Event]:
    """Make the tenant's next admission pause inside its transaction, past its checks,
    its INSERT and its charge, holding the user's lock: another session holds the
    tenant's row FOR UPDATE, so the job's foreign-key check (at commit) waits for it.
    Today's budget row is created first, so taking a budget unit checks no foreign key.
    Returns (paused, resume)."""
    resume, holding = threading.Event(), threading.Event()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO core_daily_usage (tenant_id, day, used) "
            "VALUES (%s, (now() AT TIME ZONE 'UTC')::date, 0) ON CONFLICT DO NOTHING",
            [tenant_id],
        )

    def hold() -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM tenants WHERE id = %s FOR UPDATE", [tenant_id])
                holding.set()
                resume.wait(timeout=30)
        finally:
            connections.close_all()

    threading.Thread(target=hold, name="user-row-holder").start()
    assert holding.wait(timeout=20)
    return _Paused(), resume


def test_two_concurrent_delta_admits_cannot_overdraw_the_balance(clean_queue, monkeypatch):
    user = funded_user(credits=2)
    parent = admit(user)
    assert processing.analysis_job_process(job_id=parent.id) == "complete"
    assert credit_balance(user_id=user.pk) == 1  # enough for exactly one more analysis

    # Tab A's admission pauses inside its transaction, as a slow request would.
    inserted, resume = pause_before_commit(user.tenant_id)
    outcome: dict[str, object] = {}

    def delta():
        return admit(user, delta_of_job_id=parent.id)

    a = in_thread("tab-a", outcome, delta)
    assert inserted.wait(timeout=20)
    b = in_thread("tab-b", outcome, delta)
    b.join(timeout=3)  # a correct admission waits for tab A here (the user's lock)
    resume.set()
    a.join(timeout=20)
    b.join(timeout=20)

    admitted = [o for o in outcome.values() if isinstance(o, admission.Admission)]
    refused = [o for o in outcome.values() if isinstance(o, InsufficientCredits)]
    balance = credit_balance(user_id=user.pk)
    deltas = AnalysisJob.objects.filter(delta_of_job_id=parent.id).count()
    assert balance >= 0, (
        f"balance went to {balance}: both delta admits passed the guard ({deltas} deltas "
        f"charged; outcomes {outcome})"
    )
    assert (len(admitted), len(refused)) == (1, 1), outcome


def test_expire_held_never_cancels_the_held_run_of_an_admission_in_flight(clean_queue, held_before):
    user = funded_user(credits=3)
    outcome: dict[str, object] = {}
    # Anything of the user's that is under their queue lock (a promotion, a cancel, an
    # operator's retry) while the admission waits for it.
    holder, release = hold_the_users_lock(user.pk)
    admit = in_thread(
        "admit",
        outcome,
        lambda: admission.analysis_job_admit(
            user=user, title="T", doc_html=DOC_HTML, sources=SOURCES
        ),
    )
    # The admission created (and committed) its held run and now waits for the lock.
    for _ in range(200):
        if CoreRun.objects.exists():
            break
        admit.join(timeout=0.05)
    assert CoreRun.objects.count() == 1
    # Time passes while it waits: back-date the held run past the expiry.
    CoreRun.objects.update(created_at=CoreRun.objects.get().created_at.replace(year=2000))
    expired = admission.held_runs_expire()
    release.set()
    holder.join(timeout=10)
    admit.join(timeout=30)

    result = outcome["admit"]
    assert isinstance(result, (admission.Admission, RunsError)), (
        f"expire_held (cancelled {expired}) took the held run of an admission in flight; "
        f"the admission ended in {type(result).__name__}: {result}"
    )
    if isinstance(result, RunsError):
        # The expiry won: a clean refusal that says what happened, nothing charged.
        assert isinstance(result, HoldExpired), result
        assert not AnalysisJob.objects.exists()
    if isinstance(result, admission.Admission):
        assert AnalysisJob.objects.get(pk=result.id).core_run_id in set(
            CoreRun.objects.values_list("pk", flat=True)
        )
    assert credit_balance(user_id=user.pk) in (2, 3)


def test_expire_held_skips_the_held_run_an_admission_is_committing(clean_queue, held_before):
    user = funded_user(credits=3)
    # Past the guard (which holds the held run FOR KEY SHARE), before the commit.
    inserted, resume = pause_before_commit(user.tenant_id)
    outcome: dict[str, object] = {}
    admit = in_thread(
        "admit",
        outcome,
        lambda: admission.analysis_job_admit(
            user=user, title="T", doc_html=DOC_HTML, sources=SOURCES
        ),
    )
    try:
        assert inserted.wait(timeout=20)
        CoreRun.objects.update(created_at=CoreRun.objects.get().created_at.replace(year=2000))
        assert admission.held_runs_expire() == 0, "the expiry took a run being admitted"
    finally:
        resume.set()
        admit.join(timeout=30)
    result = outcome["admit"]
    assert isinstance(result, admission.Admission), result
    assert AnalysisJob.objects.get(pk=result.id).core_run_id == CoreRun.objects.get().pk
    assert credit_balance(user_id=user.pk) == 2


def test_an_expired_hold_answers_503_with_retry_after_and_writes_nothing(
    clean_queue, api, monkeypatch, held_before
):
    """The API's side of HoldExpired: the held run is gone by the time the admission's
    guard runs (the expiry took it while the admission waited): a 503 the client can
    retry, no job, no charge."""
    from tests.runs.factories import payload

    user = funded_user(credits=3)
    real_create = LocalCore.create_held

    def created_then_expired(self, **kwargs):
        core_run_id = real_create(self, **kwargs)
        CoreRun.objects.filter(pk=core_run_id).delete()  # as held_runs_expire would
        return core_run_id

    monkeypatch.setattr(LocalCore, "create_held", created_then_expired)
    answer = api(user).post("/api/analysis-jobs", payload())

    assert answer.status_code == 503, answer.content
    assert answer.json()["error"] == "hold_expired"
    assert int(answer.headers["Retry-After"]) > 0
    assert not AnalysisJob.objects.exists()
    assert credit_balance(user_id=user.pk) == 3


def test_a_delta_admitted_during_a_retry_stays_the_runs_newest(clean_queue, monkeypatch):
    user = funded_user(credits=10)
    v1 = admit(user)
    assert processing.analysis_job_process(job_id=v1.id) == "complete"
    v2 = admit(user, delta_of_job_id=v1.id)
    with transaction.atomic():
        processing.job_fail(admission.lock_job(v2.id), reason="the core refused")

    # The retry pauses after deciding v2 is still the run's newest, before its admission.
    checked, resume = threading.Event(), threading.Event()
    real_admit = operations.analysis_job_admit

    def slow_admit(**kwargs):
        checked.set()
        resume.wait(timeout=20)
        return real_admit(**kwargs)

    monkeypatch.setattr(operations, "analysis_job_admit", slow_admit)
    outcome: dict[str, object] = {}
    retry = in_thread(
        "retry", outcome, lambda: operations.analysis_job_retry(job_id=v2.id, actor="ops")
    )
    assert checked.wait(timeout=20)
    tab = in_thread("tab", outcome, lambda: admit(user, delta_of_job_id=v1.id))
    tab.join(timeout=3)  # a correct admission waits for the retry here (the user's lock)
    resume.set()
    retry.join(timeout=20)
    tab.join(timeout=20)

    retried, delta = outcome["retry"], outcome["tab"]
    assert isinstance(retried, operations.Retried), retried
    assert isinstance(delta, admission.Admission), delta
    assert delta.id > retried.new_job_id, (
        f"the user's delta {delta.id} slipped in before the retry's job "
        f"{retried.new_job_id}: the retried older document would replace it"
    )


def test_a_failing_job_and_an_admit_of_its_user_take_their_locks_in_one_order(
    clean_queue, settings
):
    """An admission takes the user's lock, then the tenant's budget row (its held run);
    a job that fails unreleased gives its budget unit back and starts the user's next
    job. Both orders at once would deadlock (PostgreSQL aborts one: a 500 or a retried
    job): the failing job takes the user's lock first too."""
    settings.CORE_DAILY_BUDGET = 100
    user = funded_user(credits=5)
    running = admit(user)
    outcome: dict[str, object] = {}
    holder, release = hold_the_users_lock(user.pk)
    # The admission queues first for the user's lock, then the failing job behind it.
    admitting = in_thread("admit", outcome, lambda: admit(user))
    assert wait_for(lambda: waiting_on_locks() >= 1)
    failing = in_thread(
        "fail",
        outcome,
        lambda: processing.analysis_job_abandon(job_id=running.id, reason="gave up"),
    )
    assert wait_for(lambda: waiting_on_locks() >= 2)
    release.set()
    for thread in (holder, admitting, failing):
        thread.join(timeout=30)

    assert isinstance(outcome["admit"], admission.Admission), outcome["admit"]
    assert outcome["fail"] is True, outcome["fail"]
    assert AnalysisJob.objects.get(pk=running.id).status == "failed"


def _stuck_running(job_id: int, settings) -> None:
    """The job running, its held core run never released, its release window closed (the
    core was unreachable all along)."""
    from queueing.exceptions import RetryLater
    from tests.runs.factories import backdate

    settings.CORE_AVAILABLE = False
    with pytest.raises(RetryLater):
        processing.analysis_job_process(job_id=job_id)
    settings.CORE_AVAILABLE = True
    backdate("analysis_jobs", [job_id], seconds=32 * 60, columns=("release_deadline",))


def test_the_resume_sweeps_give_ups_never_deadlock_with_an_admission(clean_queue, settings):
    """After an outage of the core, two users of one tenant have expired releases. The
    resume sweep gives each up (the user's lock to promote the next, the tenant's budget
    row to give the held run back); an admission of the second user takes its lock, then
    the budget row. In one batch, the sweep held the budget row from the first give-up
    while it waited for the second user's lock: 40P01, and the admission failed. Each
    give-up now commits on its own: both give-ups and the admission go through."""
    from queueing.sweeps import run_sweep

    first = funded_user(credits=5)
    second = funded_user(credits=5, tenant=first.tenant)
    jobs = [admit(first), admit(second)]
    for job in jobs:
        _stuck_running(job.id, settings)
    # Something else of the tenant holds today's budget row (another admission), so the
    # sweep's first give-back waits for it, and the second user's admission starts
    # meanwhile: it takes its user's lock and queues for the row behind the sweep.
    holder = psycopg.connect(database_url(), autocommit=True)
    holder.execute("BEGIN")
    holder.execute(
        "SELECT used FROM core_daily_usage WHERE tenant_id = %s"
        " AND day = (now() AT TIME ZONE 'UTC')::date FOR UPDATE",
        [first.tenant_id],
    )
    outcome: dict[str, object] = {}
    sweep = in_thread("sweep", outcome, lambda: run_sweep("analysis_resume"))
    assert wait_for(lambda: waiting_on_locks() >= 1), "the sweep never waited"
    admitting = in_thread("admit", outcome, lambda: admit(second))
    assert wait_for(lambda: waiting_on_locks() >= 2), "the admission never waited"
    holder.execute("COMMIT")
    holder.close()
    sweep.join(60)
    admitting.join(60)
    assert not isinstance(outcome["admit"], BaseException), outcome["admit"]
    result = outcome["sweep"]
    assert not isinstance(result, BaseException), result
    assert (result.changed, result.failed) == (2, 0), result
    assert set(
        AnalysisJob.objects.filter(pk__in=[j.id for j in jobs]).values_list("status", flat=True)
    ) == {"failed"}


class _LockHolder:
    """A session of its own that takes the user's queue lock (waiting if need be) and
    holds it until :meth:`done` (another path of the user: an admission, a cancel)."""

    def __init__(self, user_id: int) -> None:
        self.statement, self.params = locks.xact_lock_statement(ANALYSIS_QUEUE_LOCK, user_id)
        self.got, self.release = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._hold)
        self.thread.start()

    def _hold(self) -> None:
        with psycopg.connect(database_url(), autocommit=True) as session:
            session.execute("BEGIN")
            session.execute(self.statement, self.params)
            self.got.set()
            self.release.wait(30)
            session.execute("COMMIT")

    def done(self) -> None:
        self.release.set()
        self.thread.join(30)


def test_a_cancel_of_a_job_promoted_while_it_waited_for_the_users_lock_never_deadlocks(
    clean_queue,
):
    """An operator cancels the user's queued job B while another path holds the user's
    lock; meanwhile A fails and promotes B, and B's process_job locks B's row and then
    wants the user's lock. The cancel read 'queued' before its lock and then locked B's
    row: 40P01 with B's process_job. It now reads B again under the user's lock (only a
    promotion, which takes that lock, starts a queued job) and leaves a promoted B alone."""
    user = funded_user(credits=5)
    first, second = admit(user), admit(user)
    assert (first.status, second.status) == ("pending", "queued")
    outcome: dict[str, object] = {}
    holder = _LockHolder(user.pk)
    assert holder.got.wait(10)
    failing = in_thread(
        "fail", outcome, lambda: processing.analysis_job_abandon(job_id=first.id, reason="r")
    )
    assert wait_for(lambda: waiting_on_locks() >= 1)
    queued_behind = _LockHolder(user.pk)
    assert wait_for(lambda: waiting_on_locks() >= 2)
    cancelling = in_thread(
        "cancel", outcome, lambda: admission.analysis_job_cancel(job_id=second.id)
    )
    assert wait_for(lambda: waiting_on_locks() >= 3)
    holder.done()  # the failure promotes B and commits; the second holder gets the lock
    failing.join(30)
    assert queued_behind.got.wait(10)
    assert AnalysisJob.objects.get(pk=second.id).status == "pending"
    processing_b = in_thread(
        "process", outcome, lambda: processing.analysis_job_process(job_id=second.id)
    )
    assert wait_for(lambda: waiting_on_locks() >= 2)
    queued_behind.done()
    cancelling.join(30)
    processing_b.join(30)
    assert outcome["cancel"] is False, outcome
    assert not any(isinstance(value, BaseException) for value in outcome.values()), outcome
    assert AnalysisJob.objects.get(pk=second.id).status == "complete"
