"""Admission races the per-user lock must close.

* Two delta re-checks of one user at once (two tabs, a double click, an operator's
  retry of a failed delta): a delta never waits for the slot, but its balance check and
  charge are the user's, so it takes the user's queue lock too — invariant 5, no balance
  goes negative.
* The resume tick's ``held_runs_expire`` while an admission, its held core run already
  committed, waits for the user's lock: either the expiry skips the run (the admission's
  guard holds it) or the admission is refused cleanly (``HoldExpired``, 503) — never a
  job naming a deleted run (an IntegrityError at commit, a 500).
* An operator's retry of a failed delta while the user admits a newer delta of the same
  run: the retry's "still the run's newest?" check and its admission hold the user's
  lock together, so the user's delta comes after the retry's job (it stays the newest),
  never between the check and the retry's job.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connections, transaction

from queueing import locks
from runs import admission, operations, processing
from runs.exceptions import HoldExpired, InsufficientCredits, RunsError
from runs.models import AnalysisJob, CoreRun
from runs.queue import ANALYSIS_QUEUE_LOCK
from runs.selectors import credit_balance
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


def pause_before_commit(monkeypatch, *, thread_name: str | None = None):
    """Make an admission (on ``thread_name``, or any) pause inside its transaction, past
    its guard and INSERT + charge (at the enqueue of its process_job), until resumed:
    returns the events (paused, resume)."""
    paused, resume = threading.Event(), threading.Event()
    real_enqueue = admission.enqueue_process

    def slow_enqueue(job_id, **kwargs):
        if thread_name is None or threading.current_thread().name == thread_name:
            paused.set()
            resume.wait(timeout=20)
        return real_enqueue(job_id, **kwargs)

    monkeypatch.setattr(admission, "enqueue_process", slow_enqueue)
    return paused, resume


def test_two_concurrent_delta_admits_cannot_overdraw_the_balance(clean_queue, monkeypatch):
    user = funded_user(credits=2)
    parent = admit(user)
    assert processing.analysis_job_process(job_id=parent.id) == "complete"
    assert credit_balance(user_id=user.pk) == 1  # enough for exactly one more analysis

    # Tab A's admission pauses inside its transaction, as a slow request would.
    inserted, resume = pause_before_commit(monkeypatch, thread_name="tab-a")
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


def test_expire_held_never_cancels_the_held_run_of_an_admission_in_flight(clean_queue, settings):
    user = funded_user(credits=3)
    holding, release = threading.Event(), threading.Event()
    outcome: dict[str, object] = {}

    def hold_the_users_lock():
        # Anything of the user's that is under their queue lock (a promotion, a cancel,
        # an operator's retry) while the admission waits for it.
        try:
            with transaction.atomic():
                locks.xact_lock(ANALYSIS_QUEUE_LOCK, user.pk)
                holding.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_users_lock)
    holder.start()
    assert holding.wait(timeout=10)
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


def test_expire_held_skips_the_held_run_an_admission_is_committing(clean_queue, monkeypatch):
    user = funded_user(credits=3)
    # Past the guard (which holds the held run FOR KEY SHARE), before the commit.
    inserted, resume = pause_before_commit(monkeypatch)
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
    clean_queue, api, monkeypatch
):
    """The API's side of HoldExpired: the held run is gone by the time the admission's
    guard runs (the expiry took it while the admission waited): a 503 the client can
    retry, no job, no charge."""
    from runs.core import LocalCore
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
