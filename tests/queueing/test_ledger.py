"""The stage ledger (``queueing/ledger.py``): claim, complete, fail, lease renewal.

Fault model — at each step, what can die, stall or race; what must hold; the test:

claim
  - N workers claim at once: one is *claimed*, the rest *busy*
    (test_sixteen_concurrent_claimers_one_claims_the_rest_are_busy)
  - the stage already succeeded: *done*, the row never changes
    (test_after_success_every_claim_is_done_and_the_row_never_changes)
compute
  - the holder dies, its lease runs out: a successor claims with token + 1, the old holder
    is fenced off (test_expired_lease_is_reclaimed_and_the_old_holder_is_fenced_off)
  - the holder's worker dies and stalled recovery takes its job back: its lease is dead
    at once, for other jobs (test_a_holder_whose_job_recovery_took_back_loses_its_lease_at_once)
    and for the job's own new run (test_a_new_run_of_the_holders_own_job_takes_over_at_once);
    with real workers, SIGKILL mid-stage: faults/test_dead_holder.py; a claim outside any
    job is held by its lease alone (test_a_claim_outside_a_job_is_held_by_its_lease_alone)
  - a run whose job was taken back before it claimed (its fetch lost with the server, a
    recovery, a timeout's next attempt) claims nothing: LeaseLost
    (test_a_run_whose_job_was_taken_back_claims_nothing,
    test_a_run_of_another_worker_claims_nothing_on_a_live_job)
  - the holder lives longer than its lease: the renewal keeps it; a second claimer is
    *busy* (test_renewal_keeps_a_live_holders_lease_past_its_length)
  - the holder stalled and was taken over while its renewal thread runs: the stale
    renewal extends nothing and records the loss
    (test_a_renewal_after_a_takeover_does_not_extend_the_successors_lease,
    test_renew_is_compare_and_set_on_the_token)
renewal
  - the database is briefly unreachable: logged, renewed at the next tick
    (test_a_failed_renewal_is_tried_again)
  - the block ends: the thread stops and closes its connection
    (test_the_renewal_thread_closes_its_connection)
  - the block ends before the first tick (most do): no thread was started for it
    (test_a_block_shorter_than_a_tick_starts_no_renewal_thread), and the starter keeps
    nothing of it until its tick would have come (a third of the lease: a busy worker's
    ended blocks would pile up) (test_an_ended_block_is_not_kept_until_its_tick)
hold
  - the prerequisite is ``success`` with the token seen: passes; another token, reopened,
    no row: ``PrerequisiteChanged`` says what it is now
    (test_hold_passes_only_on_success_with_the_same_token)
  - outside a transaction its lock would end with its statement: refused
    (test_hold_outside_a_transaction_is_refused)
  - a reopening of the prerequisite waits for the holder's transaction
    (test_a_held_prerequisite_is_reopened_only_after_the_holder_commits)
complete, saving the holder's job (``finish_job=True``)
  - it commits: the job is ``succeeded`` in the same statement, and the worker is told it
    has nothing more to save (test_complete_with_finish_job_saves_the_jobs_success_at_its_commit)
  - the caller's transaction rolls back, or the savepoint around the complete: the job is
    still ``doing``, the worker saves it as ever (test_a_rolled_back_complete_saves_no_job,
    test_a_complete_in_a_rolled_back_savepoint_saves_no_job)
  - the caller vanishes before its COMMIT (a lost host): the job's row, locked since the
    complete, is released within the bound the run gave, not at the server's TCP timeout
    (test_a_transaction_that_saved_the_job_and_never_commits_is_ended_within_its_bound)
  - recovery took the job back (or ended its run) meanwhile: the stage completes, the job
    is left to its new run (test_a_job_no_longer_this_runs_is_not_finished_by_complete)
  - the stale token: nothing at all (test_a_stale_complete_finishes_no_job)
  - outside a worker's job: an ordinary complete (test_finish_job_outside_a_job_is_a_plain_complete)
  - the worker settled the run before the commit's notice came (an async run cancelled
    while its thread went on to commit): the notice is dropped, nothing is kept
    (test_a_notice_after_the_run_was_settled_is_dropped)
fail
  - the work raised: ``failed`` with the error, claimable again
    (test_failed_row_stays_claimable_and_keeps_the_error)
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
from django.db import DatabaseError, OperationalError, connection, transaction
from django.db.transaction import TransactionManagementError

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing import current
from queueing.enqueue import enqueue
from queueing.exceptions import LeaseLost, PrerequisiteChanged
from queueing.ledger import _STARTER, Ledger, Outcome, Prerequisite
from tests.conftest import make_doing, run_concurrently, wait_for
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


# --- lease renewal: time moves by back-dating the lease, never by sleeping


def lease_is_live(entry_id: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_expires_at > now() FROM test_steps WHERE id = %s", [entry_id])
        return cursor.fetchone()[0]


def test_renewal_keeps_a_live_holders_lease_past_its_length():
    claim = LEDGER.claim(unit="r1", stage="extract")
    with LEDGER.renewing(claim, every=0.05) as renewal:
        # The holder has computed for longer than its lease.
        expire_lease("r1", "extract")
        wait_for(lambda: lease_is_live(claim.entry_id), timeout=10, message="a renewal")
        [second] = run_concurrently(lambda i: LEDGER.claim(unit="r1", stage="extract"), 1)
        assert second.outcome is Outcome.BUSY
    assert renewal.renewals >= 1 and not renewal.lost.is_set()
    LEDGER.complete(claim)
    row = Step.objects.get(pk=claim.entry_id)
    assert (row.status, row.attempts) == ("success", 1)


def test_a_renewal_after_a_takeover_does_not_extend_the_successors_lease():
    old = LEDGER.claim(unit="r2", stage="extract")
    with LEDGER.renewing(old, every=0.05) as renewal:
        # The old holder stalled past its lease and a successor took over; a renewal
        # racing this transaction waits for it and then finds the token stale.
        with transaction.atomic():
            expire_lease("r2", "extract")
            new = LEDGER.claim(unit="r2", stage="extract", lease_seconds=120)
        assert new.outcome is Outcome.CLAIMED and new.token == old.token + 1
        successor_lease = Step.objects.get(pk=new.entry_id).lease_expires_at
        wait_for(renewal.lost.is_set, timeout=10, message="the stale renewal")
    assert Step.objects.get(pk=new.entry_id).lease_expires_at == successor_lease
    with pytest.raises(LeaseLost):
        LEDGER.complete(old)
    LEDGER.complete(new)


def test_renew_is_compare_and_set_on_the_token():
    old = LEDGER.claim(unit="r3", stage="extract")
    assert LEDGER.renew(old)
    expire_lease("r3", "extract")
    new = LEDGER.claim(unit="r3", stage="extract")
    successor_lease = Step.objects.get(pk=new.entry_id).lease_expires_at
    assert not LEDGER.renew(old)
    assert Step.objects.get(pk=new.entry_id).lease_expires_at == successor_lease
    assert LEDGER.renew(new, lease_seconds=600)
    assert Step.objects.get(pk=new.entry_id).lease_expires_at > successor_lease
    LEDGER.complete(new)
    assert not LEDGER.renew(new), "a closed row's lease is not renewed"


def test_a_failed_renewal_is_tried_again(monkeypatch):
    real_renew = Ledger.renew
    calls = []

    def flaky_renew(self, claim, **kwargs):
        calls.append(claim.entry_id)
        if len(calls) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return real_renew(self, claim, **kwargs)

    monkeypatch.setattr(Ledger, "renew", flaky_renew)
    claim = LEDGER.claim(unit="r4", stage="extract")
    with LEDGER.renewing(claim, every=0.05) as renewal:
        wait_for(lambda: renewal.renewals >= 1, timeout=10, message="a renewal after the error")
    assert len(calls) >= 2 and not renewal.lost.is_set()
    LEDGER.complete(claim)


def backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()")
        return cursor.fetchone()[0]


def test_the_renewal_thread_closes_its_connection():
    claim = LEDGER.claim(unit="r5", stage="extract")
    before = backends()
    with LEDGER.renewing(claim, every=0.05) as renewal:
        wait_for(lambda: renewal.renewals >= 1, timeout=10, message="a renewal")
        assert backends() == before + 1
    wait_for(lambda: backends() == before, timeout=10, message="the renewal's connection closed")


def test_a_block_shorter_than_a_tick_starts_no_renewal_thread():
    claim = LEDGER.claim(unit="r6", stage="extract")
    name = f"lease-renewal-Step-{claim.entry_id}"
    with LEDGER.renewing(claim, every=600) as renewal:
        started = [t for t in threading.enumerate() if t.name == name]
    assert started == [] and renewal.renewals == 0
    LEDGER.complete(claim)


def test_an_ended_block_is_not_kept_until_its_tick():
    long = LEDGER.claim(unit="r7", stage="long")
    # A stage computing for long: its tick comes first, so the blocks ended after it queue
    # behind it in the starter.
    with LEDGER.renewing(long, every=600):
        claim = LEDGER.claim(unit="r7", stage="extract")
        with LEDGER.renewing(claim, every=600) as renewal:
            pass
        LEDGER.complete(claim)
        ended = weakref.ref(renewal)
        del renewal
        for n in range(200):  # a busy worker: many short blocks, each ended long before its tick
            other = LEDGER.claim(unit="r7", stage=f"s{n}")
            with LEDGER.renewing(other, every=600):
                pass
        gc.collect()
        assert ended() is None, "the starter still holds an ended block's renewal"
        assert len(_STARTER._due) < 200
    LEDGER.complete(long)


def test_hold_passes_only_on_success_with_the_same_token():
    LEDGER.complete(first := LEDGER.claim(unit="h1", stage="extract"))
    key = {"unit": "h1", "stage": "extract"}
    with transaction.atomic():
        LEDGER.hold(Prerequisite(key=key, token=first.token))
    for token in (None, first.token + 1):
        with transaction.atomic(), pytest.raises(PrerequisiteChanged) as raised:
            LEDGER.hold(Prerequisite(key=key, token=token))
        assert (raised.value.status, raised.value.token) == ("success", first.token)
    Step.objects.filter(pk=first.entry_id).update(status="failed")
    with transaction.atomic(), pytest.raises(PrerequisiteChanged) as raised:
        LEDGER.hold(Prerequisite(key=key, token=first.token))
    assert raised.value.status == "failed"
    with transaction.atomic(), pytest.raises(PrerequisiteChanged) as raised:
        LEDGER.hold(Prerequisite(key={"unit": "h1", "stage": "none"}, token=1))
    assert (raised.value.status, raised.value.token) == (None, None)


def test_hold_outside_a_transaction_is_refused():
    LEDGER.complete(first := LEDGER.claim(unit="h2", stage="extract"))
    with pytest.raises(TransactionManagementError):
        LEDGER.hold(Prerequisite(key={"unit": "h2", "stage": "extract"}, token=first.token))


def test_a_held_prerequisite_is_reopened_only_after_the_holder_commits():
    LEDGER.complete(first := LEDGER.claim(unit="h3", stage="extract"))
    held = threading.Event()
    release = threading.Event()

    def holder(i):
        with transaction.atomic():
            LEDGER.hold(Prerequisite(key={"unit": "h3", "stage": "extract"}, token=first.token))
            held.set()
            assert release.wait(timeout=20)

    def reopen(i):
        assert held.wait(timeout=20)
        Step.objects.filter(pk=first.entry_id).update(status="failed")
        return "reopened"

    done = []
    thread = threading.Thread(target=lambda: done.extend(run_concurrently(reopen, 1)))
    holding = threading.Thread(target=lambda: run_concurrently(holder, 1))
    holding.start()
    thread.start()
    wait_for(lambda: _lock_waiters() > 0, timeout=20, message="the reopening to wait")
    assert Step.objects.get(pk=first.entry_id).status == "success"
    release.set()
    holding.join()
    thread.join()
    assert done == ["reopened"]
    assert Step.objects.get(pk=first.entry_id).status == "failed"


def _lock_waiters() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def _job_doing() -> int:
    """A job a live worker runs now."""
    job = enqueue("tests.record", args={"label": "holder"})
    make_doing(job.job_id, heartbeat_age_s=0)
    return job.job_id


def test_a_holder_whose_job_recovery_took_back_loses_its_lease_at_once(clean_queue):
    holder, other = _job_doing(), _job_doing()
    with current.running(holder):
        held = LEDGER.claim(unit="dead", stage="s")
    assert held.claimed
    # While the holder's job runs, its lease holds, for other jobs and outside any job.
    with current.running(other):
        assert LEDGER.claim(unit="dead", stage="s").outcome is Outcome.BUSY
    assert LEDGER.claim(unit="dead", stage="s").outcome is Outcome.BUSY
    # Stalled recovery declared the holder's worker dead and put its job back: the lease
    # (590 s to go) is dead with it, and the next poll takes over.
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_jobs SET status = 'todo' WHERE id = %s", [holder])
    with current.running(other):
        taken = LEDGER.claim(unit="dead", stage="s")
    assert taken.claimed and taken.token == 2
    with pytest.raises(LeaseLost):
        LEDGER.complete(held)
    assert Step.objects.get(pk=taken.entry_id).holder_job_id == other


def test_a_new_run_of_the_holders_own_job_takes_over_at_once(clean_queue):
    """Recovery took the job back and a worker runs it again (it is ``doing`` again): its
    new run is not blocked by the lease of its own dead run."""
    job = _job_doing()
    with current.running(job):
        first = LEDGER.claim(unit="rerun", stage="s")
        again = LEDGER.claim(unit="rerun", stage="s")
    assert first.claimed and again.claimed and again.token == 2


def test_a_claim_outside_a_job_is_held_by_its_lease_alone(clean_queue):
    held = LEDGER.claim(unit="lease", stage="s")
    assert held.claimed and Step.objects.get(pk=held.entry_id).holder_job_id is None
    with current.running(_job_doing()):
        assert LEDGER.claim(unit="lease", stage="s").outcome is Outcome.BUSY


@pytest.mark.parametrize(
    "taken_back",
    [
        pytest.param(
            "UPDATE procrastinate_jobs SET status = 'todo' WHERE id = %s", id="fetch-lost"
        ),
        pytest.param(
            "UPDATE procrastinate_jobs SET worker_id = NULL, status = 'todo' WHERE id = %s",
            id="recovered",
        ),
        pytest.param(
            "UPDATE procrastinate_jobs SET attempts = attempts + 1 WHERE id = %s",
            id="next-attempt",
        ),
    ],
)
def test_a_run_whose_job_was_taken_back_claims_nothing(clean_queue, taken_back):
    """A worker's run claims only while its job is that run: after a fetch lost with a
    crashed server (claims_first), a recovery, or a timeout's next attempt, the old run
    raises LeaseLost and writes nothing, so it starts no work beside the job's next run."""
    job = enqueue("tests.record", args={"label": "gone"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    with connection.cursor() as cursor:
        cursor.execute(taken_back, [job])
    run = _run_of(job, worker, [])
    with current.running(job, run=run), pytest.raises(LeaseLost, match="no longer its job's"):
        LEDGER.claim(unit="gone", stage="s")
    assert not Step.objects.filter(unit="gone").exists()
    # The job's next run, on another worker, claims as usual.
    other = make_doing(job, heartbeat_age_s=0)
    with current.running(job, run=_run_of(job, other, [])):
        assert LEDGER.claim(unit="gone", stage="s").claimed


def test_a_run_whose_worker_row_was_pruned_still_claims(clean_queue):
    """A worker cut off long enough to be pruned leaves its jobs ``doing`` with no worker
    (the foreign key's ON DELETE SET NULL) until it registers again and takes them back:
    its runs still own their jobs meanwhile, and claim."""
    job = enqueue("tests.record", args={"label": "pruned"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM procrastinate_workers WHERE id = %s", [worker])
        cursor.execute("SELECT worker_id, status FROM procrastinate_jobs WHERE id = %s", [job])
        assert cursor.fetchone() == (None, "doing")
    with current.running(job, run=_run_of(job, worker, [])):
        assert LEDGER.claim(unit="pruned", stage="s").claimed


def test_a_run_reads_its_workers_id_when_it_claims(clean_queue):
    """A worker that registered again took its running jobs back under its new id: its
    runs claim under the id the worker has now, not the one it had when they started."""
    job = enqueue("tests.record", args={"label": "again"}).job_id
    old = make_doing(job, heartbeat_age_s=0)
    ids = {"now": old}
    run = _run_of(job, old, [], ids=ids)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id",
        )
        (new,) = cursor.fetchone()
        cursor.execute("UPDATE procrastinate_jobs SET worker_id = %s WHERE id = %s", [new, job])
    with current.running(job, run=run), pytest.raises(LeaseLost, match=r"\(attempt 1\)"):
        LEDGER.claim(unit="again", stage="s")
    ids["now"] = new
    with current.running(job, run=run):
        assert LEDGER.claim(unit="again", stage="s").claimed


def test_a_run_of_another_worker_claims_nothing_on_a_live_job(clean_queue):
    """The job is doing, but as another worker's run (the old run's fetch was lost and
    another worker fetched the job): the old run claims nothing, even the stage its job
    holds."""
    job = enqueue("tests.record", args={"label": "twice"}).job_id
    first = make_doing(job, heartbeat_age_s=0)
    second = make_doing(job, heartbeat_age_s=0)
    with current.running(job, run=_run_of(job, second, [])):
        held = LEDGER.claim(unit="twice", stage="s")
    assert held.claimed
    with current.running(job, run=_run_of(job, first, [])), pytest.raises(LeaseLost):
        LEDGER.claim(unit="twice", stage="s")
    assert Step.objects.get(pk=held.entry_id).attempts == 1


def _run_of(
    job_id: int,
    worker_id: int | None,
    saved: list,
    *,
    commit_within: float = 30,
    ids: dict[str, int | None] | None = None,
) -> current.JobRun:
    """A worker's run of the job; with ``ids``, its worker's id is ``ids["now"]`` as the
    run reads it (a worker that registers again moves it)."""
    return current.JobRun(
        job_id=job_id,
        attempts=0,
        worker=(lambda: worker_id) if ids is None else (lambda: ids["now"]),
        delete_on_success=False,
        commit_within_seconds=commit_within,
        saved=lambda: saved.append(job_id),
    )


def _job_status(job_id: int) -> str | None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT status FROM procrastinate_jobs WHERE id = %s", [job_id])
        row = cursor.fetchone()
    return row[0] if row else None


def test_complete_with_finish_job_saves_the_jobs_success_at_its_commit(clean_queue):
    job = enqueue("tests.record", args={"label": "finish"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    saved: list[int] = []
    with current.running(job, run=_run_of(job, worker, saved)):
        claim = LEDGER.claim(unit="fin", stage="s")
        with transaction.atomic():
            LEDGER.complete(claim, finish_job=True)
            assert saved == []  # told only once the transaction commits
            assert _job_status(job) == "succeeded"  # in this transaction
    assert saved == [job]
    assert _job_status(job) == "succeeded"
    assert Step.objects.get(pk=claim.entry_id).status == "success"


def test_complete_saves_the_job_under_the_workers_id_as_it_is_then(clean_queue):
    """The worker registered again between the run's claim and its complete (its job
    taken back under the new id): the complete saves the job's success under the new
    id, read when it is sent."""
    job = enqueue("tests.record", args={"label": "moved"}).job_id
    old = make_doing(job, heartbeat_age_s=0)
    ids = {"now": old}
    saved: list[int] = []
    run = _run_of(job, old, saved, ids=ids)
    with current.running(job, run=run):
        claim = LEDGER.claim(unit="moved", stage="s")
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")
            (new,) = cursor.fetchone()
            cursor.execute("UPDATE procrastinate_jobs SET worker_id = %s WHERE id = %s", [new, job])
        ids["now"] = new
        with transaction.atomic():
            LEDGER.complete(claim, finish_job=True)
    assert saved == [job]
    assert _job_status(job) == "succeeded"


def test_a_run_whose_worker_has_no_id_claims_nothing(clean_queue):
    """A run that outlived its worker's stop (its id cleared) is fenced, never unfenced:
    with no id to fence on, it claims nothing."""
    job = enqueue("tests.record", args={"label": "stopped"}).job_id
    make_doing(job, heartbeat_age_s=0)
    run = _run_of(job, None, [])
    with current.running(job, run=run), pytest.raises(LeaseLost, match="no id"):
        LEDGER.claim(unit="stopped", stage="s")
    assert not Step.objects.filter(unit="stopped").exists()


def test_a_rolled_back_complete_saves_no_job(clean_queue):
    job = enqueue("tests.record", args={"label": "rollback"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    saved: list[int] = []
    with current.running(job, run=_run_of(job, worker, saved)):
        claim = LEDGER.claim(unit="rb", stage="s")
        with pytest.raises(RuntimeError), transaction.atomic():
            LEDGER.complete(claim, finish_job=True)
            raise RuntimeError("the write after the complete failed")
    assert saved == []
    assert _job_status(job) == "doing"
    assert Step.objects.get(pk=claim.entry_id).status == "running"


@pytest.mark.parametrize("taken", ["recovered", "other worker", "next attempt"])
def test_a_job_no_longer_this_runs_is_not_finished_by_complete(clean_queue, taken):
    job = enqueue("tests.record", args={"label": "taken"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    saved: list[int] = []
    with current.running(job, run=_run_of(job, worker, saved)):
        claim = LEDGER.claim(unit=f"tk-{taken}", stage="s")
        change = {
            "recovered": "status = 'todo', worker_id = NULL",
            "other worker": f"worker_id = {make_doing(_job_doing(), heartbeat_age_s=0)}",
            "next attempt": "attempts = attempts + 1",
        }[taken]
        with connection.cursor() as cursor:
            cursor.execute(f"UPDATE procrastinate_jobs SET {change} WHERE id = %s", [job])
        LEDGER.complete(claim, finish_job=True)
    assert saved == []
    assert _job_status(job) == ("todo" if taken == "recovered" else "doing")
    assert Step.objects.get(pk=claim.entry_id).status == "success"


def test_a_stale_complete_finishes_no_job(clean_queue):
    job = enqueue("tests.record", args={"label": "stale"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    saved: list[int] = []
    with current.running(job, run=_run_of(job, worker, saved)):
        old = LEDGER.claim(unit="st", stage="s")
        expire_lease("st", "s")
        with current.running(None):
            LEDGER.claim(unit="st", stage="s")
        with pytest.raises(LeaseLost):
            LEDGER.complete(old, finish_job=True)
    assert saved == []
    assert _job_status(job) == "doing"


def test_finish_job_outside_a_job_is_a_plain_complete(clean_queue):
    claim = LEDGER.claim(unit="plain", stage="s")
    LEDGER.complete(claim, finish_job=True)
    assert Step.objects.get(pk=claim.entry_id).status == "success"


def test_a_complete_in_a_rolled_back_savepoint_saves_no_job(clean_queue):
    job = enqueue("tests.record", args={"label": "savepoint"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    saved: list[int] = []
    with current.running(job, run=_run_of(job, worker, saved)):
        claim = LEDGER.claim(unit="sp", stage="s")
        with transaction.atomic(), pytest.raises(RuntimeError), transaction.atomic():
            LEDGER.complete(claim, finish_job=True)
            raise RuntimeError("the savepoint rolls back")
    assert saved == []
    assert _job_status(job) == "doing"
    assert Step.objects.get(pk=claim.entry_id).status == "running"


def test_a_transaction_that_saved_the_job_and_never_commits_is_ended_within_its_bound(
    clean_queue,
):
    """Between the complete and the COMMIT the job's row is locked: stalled recovery skips
    it and a starting worker's prune would wait for it. A caller that never sends its
    COMMIT has its session ended once it idled longer than the run's bound (the worker's
    stall threshold; 0.5 s here), which rolls the whole stage back."""
    job = enqueue("tests.record", args={"label": "zombie"}).job_id
    worker = make_doing(job, heartbeat_age_s=0)
    saved: list[int] = []
    with current.running(job, run=_run_of(job, worker, saved, commit_within=0.5)):
        claim = LEDGER.claim(unit="zombie", stage="s")
        with (
            pytest.raises(DatabaseError, match="idle-in-transaction timeout"),
            transaction.atomic(),
        ):
            LEDGER.complete(claim, finish_job=True)
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                (pid,) = cursor.fetchone()
            # The server, not the client, ends it: waiting out the bound is the test.
            wait_for(lambda: not _backend_alive(pid), timeout=10, message="the session's end")
    connection.close()
    assert saved == []
    assert _job_status(job) == "doing"
    assert Step.objects.get(pk=claim.entry_id).status == "running"


def _backend_alive(pid: int) -> bool:
    import psycopg
    from procrastinate.contrib.django.utils import connector_params

    with psycopg.connect(**connector_params(), autocommit=True) as other:
        row = other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [pid])
        return row.fetchone()[0] > 0


def test_a_notice_after_the_run_was_settled_is_dropped():
    """The worker's bookkeeping of runs whose code saved their success: noted only while
    the run is unsettled, so none stays in memory once the worker moved on."""
    import types

    from queueing.worker import PgstageWorker

    worker = types.SimpleNamespace(
        _runs_lock=threading.Lock(), _unsettled=set(), _saved_by_task=set()
    )
    job = types.SimpleNamespace(id=7, attempts=0)
    PgstageWorker._unsettle(worker, job)
    PgstageWorker._note_saved_by_task(worker, (7, 0))
    assert PgstageWorker._settled_by_task(worker, job) is True
    PgstageWorker._unsettle(worker, job)
    assert PgstageWorker._settled_by_task(worker, job) is False  # settled first
    PgstageWorker._note_saved_by_task(worker, (7, 0))  # the late notice
    assert worker._saved_by_task == set() and worker._unsettled == set()
