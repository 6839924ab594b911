from __future__ import annotations

import datetime

import pytest
from django.db import connection, transaction

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing.enqueue import Policy, enqueue, queueing_lock_for, queueing_lock_prefix
from queueing.exceptions import InvalidKey, QueueingError
from queueing.keys import KeyFormat
from tests.conftest import jobs, run_concurrently

pytestmark = pytest.mark.django_db(transaction=True)


def set_status(job_id: int, status: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_jobs SET status = %s WHERE id = %s", [status, job_id])


def test_plain_enqueue_creates_a_job_with_the_task_defaults(clean_queue):
    result = enqueue("tests.record", args={"label": "x"})
    assert result.created is True
    [job] = jobs()
    assert job["id"] == result.job_id
    assert job["task_name"] == "tests.record"
    assert job["args"] == {"label": "x"}
    assert job["status"] == "todo"


@pytest.mark.parametrize("policy", [Policy.SHORT, Policy.EXCLUSIVE])
def test_twenty_concurrent_enqueues_of_one_key_make_one_job(clean_queue, policy):
    results = run_concurrently(
        lambda i: enqueue("tests.record", args={"label": str(i)}, key="k:1", policy=policy), 20
    )
    assert not [r for r in results if isinstance(r, BaseException)], results
    assert len(jobs()) == 1
    assert sum(r.created for r in results) == 1
    assert {r.job_id for r in results} == {jobs()[0]["id"]}


def test_exclusive_allows_no_second_job_while_the_first_runs(clean_queue):
    first = enqueue("tests.record", args={"label": "a"}, key="k:2", policy=Policy.EXCLUSIVE)
    set_status(first.job_id, "doing")
    again = enqueue("tests.record", args={"label": "b"}, key="k:2", policy=Policy.EXCLUSIVE)
    assert again.created is False and again.job_id == first.job_id
    assert len(jobs()) == 1
    set_status(first.job_id, "succeeded")
    after = enqueue("tests.record", args={"label": "c"}, key="k:2", policy=Policy.EXCLUSIVE)
    assert after.created is True


def test_short_allows_one_waiting_job_beside_a_running_one(clean_queue):
    first = enqueue("tests.record", args={"label": "a"}, key="k:3", policy=Policy.SHORT)
    set_status(first.job_id, "doing")
    waiting = enqueue("tests.record", args={"label": "b"}, key="k:3", policy=Policy.SHORT)
    assert waiting.created is True
    dedup = enqueue("tests.record", args={"label": "c"}, key="k:3", policy=Policy.SHORT)
    assert dedup == type(dedup)(job_id=waiting.job_id, created=False)


def test_exclusive_under_twenty_threads_while_running(clean_queue):
    first = enqueue("tests.record", args={"label": "a"}, key="k:4", policy=Policy.EXCLUSIVE)
    set_status(first.job_id, "doing")
    results = run_concurrently(
        lambda i: enqueue("tests.record", args={"label": "b"}, key="k:4", policy=Policy.EXCLUSIVE),
        20,
    )
    assert all(r.job_id == first.job_id and not r.created for r in results), results
    assert len(jobs()) == 1


def test_dedup_does_not_abort_the_callers_transaction(clean_queue):
    enqueue("tests.record", args={"label": "a"}, key="k:5", policy=Policy.SHORT)
    with transaction.atomic():
        again = enqueue("tests.record", args={"label": "b"}, key="k:5", policy=Policy.SHORT)
        assert again.created is False
        # The transaction is still usable: a write after the dedup commits.
        enqueue("tests.record", args={"label": "after"})
    assert [j["args"]["label"] for j in jobs()] == ["a", "after"]


def test_enqueue_rolls_back_with_the_transaction(clean_queue):
    with pytest.raises(RuntimeError), transaction.atomic():
        enqueue("tests.record", args={"label": "gone"})
        raise RuntimeError("business write failed")
    assert jobs() == []


def test_schedule_in_sets_scheduled_at(clean_queue):
    before = datetime.datetime.now(datetime.UTC)
    enqueue("tests.record", args={"label": "later"}, schedule_in=datetime.timedelta(hours=1))
    with connection.cursor() as cursor:
        cursor.execute("SELECT scheduled_at FROM procrastinate_jobs")
        (scheduled_at,) = cursor.fetchone()
    assert scheduled_at >= before + datetime.timedelta(minutes=59)


def test_policy_and_key_must_agree():
    with pytest.raises(QueueingError, match="needs a singleton key"):
        queueing_lock_for(None, Policy.EXCLUSIVE)
    with pytest.raises(QueueingError, match="needs a policy"):
        queueing_lock_for("a:b", Policy.NONE)
    with pytest.raises(InvalidKey):
        queueing_lock_for("a b", Policy.SHORT)
    assert queueing_lock_for("a:b", Policy.EXCLUSIVE) == "exclusive/a:b"
    assert queueing_lock_for("a:b", Policy.SHORT) == "a:b"


def test_an_unknown_task_name_is_refused_and_writes_nothing(clean_queue):
    from queueing.exceptions import UnknownTask

    with pytest.raises(UnknownTask, match=r"no task named 'tests\.typo'"):
        enqueue("tests.typo", args={})
    assert jobs() == []


def test_a_lock_prefix_is_what_the_format_builds_but_its_last_part():
    fmt = KeyFormat(prefix="analysis", parts=("job",))
    for policy in (Policy.SHORT, Policy.EXCLUSIVE):
        prefix = queueing_lock_prefix(fmt, policy)
        assert prefix + "42" == queueing_lock_for(fmt.build(job=42), policy)
    stage = KeyFormat(parts=("stage", "tenant", "anfrage"))
    assert queueing_lock_prefix(stage, Policy.EXCLUSIVE, stage="x", tenant="acme") == (
        "exclusive/x:acme:"
    )
    with pytest.raises(QueueingError):
        queueing_lock_prefix(fmt, Policy.NONE)
