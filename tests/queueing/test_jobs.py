"""Operators' retry and cancel go through the framework; procrastinate's own retry gets a
clear refusal; an upgrade of procrastinate cannot silently diverge from ``enqueue``.

Fault model — an operator's action races or collides with:
- a fresh job holding the failed job's singleton key (the exclusive index):
  test_retrying_a_failed_job_whose_key_a_fresh_job_holds_points_at_that_job,
  test_procrastinates_own_retry_is_refused_with_a_message_naming_the_holder
- the job's live worker (procrastinate's admin retries 'doing' jobs):
  test_a_running_job_is_not_retried_under_its_live_worker
- the job's dead worker: test_a_stalled_job_is_recovered_at_once
- the domain row behind a cancelled job: test_cancel_settles_the_domain_and_only_waiting_jobs
- the workers waiting on LISTEN for a retried job:
  test_a_retried_failed_job_wakes_the_workers_listening_on_its_queue
- the admin's actions: test_the_job_admins_retry_and_cancel_use_the_framework
- procrastinate's defer growing a column or setting that enqueue lacks:
  test_enqueue_inserts_what_procrastinates_defer_inserts
"""

from __future__ import annotations

import importlib.metadata
import json
import re

import psycopg
import pytest
from django.db import IntegrityError, connection, transaction

import tests.queueing.tasks  # noqa: F401
from queueing import giveup
from queueing.enqueue import Policy, enqueue
from queueing.jobs import CancelRefused, RetryOutcome, job_cancel, job_retry
from queueing.sql import queries
from tests.conftest import database_url, jobs
from tests.queueing.tasks import given_up
from tests.queueing.test_stalled import make_doing

pytestmark = pytest.mark.django_db(transaction=True)


def fail(job_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute("UPDATE procrastinate_jobs SET status = 'failed' WHERE id = %s", [job_id])


def status(job_id: int) -> str:
    return jobs(id=job_id)[0]["status"]


def test_retrying_a_failed_job_with_a_free_key_puts_it_back(clean_queue):
    job = enqueue("tests.record", args={"label": "x"}, key="k:1", policy=Policy.EXCLUSIVE)
    fail(job.job_id)
    assert job_retry(job_id=job.job_id).outcome is RetryOutcome.RETRIED
    assert status(job.job_id) == "todo"
    assert job_retry(job_id=job.job_id).outcome is RetryOutcome.NOT_RETRYABLE


def test_retrying_a_failed_job_whose_key_a_fresh_job_holds_points_at_that_job(clean_queue):
    old = enqueue("tests.record", args={"label": "old"}, key="k:2", policy=Policy.EXCLUSIVE)
    fail(old.job_id)
    fresh = enqueue("tests.record", args={"label": "new"}, key="k:2", policy=Policy.EXCLUSIVE)
    make_doing(fresh.job_id, heartbeat_age_s=0)

    retried = job_retry(job_id=old.job_id)

    assert (retried.outcome, retried.holder_id) == (RetryOutcome.DEDUPLICATED, fresh.job_id)
    assert (status(old.job_id), status(fresh.job_id)) == ("failed", "doing")


def test_procrastinates_own_retry_is_refused_with_a_message_naming_the_holder(clean_queue):
    old = enqueue("tests.record", args={"label": "old"}, key="k:3", policy=Policy.EXCLUSIVE)
    fail(old.job_id)
    fresh = enqueue("tests.record", args={"label": "new"}, key="k:3", policy=Policy.EXCLUSIVE)

    with (
        pytest.raises(IntegrityError) as refused,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(queries["retry_failed_job"], {"job_id": old.job_id})
    message = str(refused.value)
    assert f"job {old.job_id} cannot go back to todo: job {fresh.job_id} holds" in message
    assert "exclusive/k:3" in message and "deduplicates onto it" in message


def test_a_running_job_is_not_retried_under_its_live_worker(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, heartbeat_age_s=0)
    retried = job_retry(job_id=job.job_id)
    assert retried.outcome is RetryOutcome.RUNNING and "run it twice" in retried.detail
    assert status(job.job_id) == "doing"


def test_a_stalled_job_is_recovered_at_once(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    make_doing(job.job_id, heartbeat_age_s=3600)
    retried = job_retry(job_id=job.job_id)
    assert (retried.outcome, retried.detail) == (RetryOutcome.RECOVERED, "retried")
    assert status(job.job_id) == "todo"


def test_unknown_jobs_are_reported_missing(clean_queue):
    assert job_retry(job_id=10**9).outcome is RetryOutcome.MISSING


def test_cancel_settles_the_domain_and_only_waiting_jobs(effects):
    waiting = enqueue("tests.settled", args={"label": "w"})
    running = enqueue("tests.settled", args={"label": "r"})
    make_doing(running.job_id, heartbeat_age_s=0)

    assert job_cancel(job_id=waiting.job_id, actor="admin:ops") is True
    assert job_cancel(job_id=running.job_id, actor="admin:ops") is False
    assert job_cancel(job_id=waiting.job_id, actor="admin:ops") is False
    assert (status(waiting.job_id), status(running.job_id)) == ("cancelled", "doing")
    assert given_up(effects()) == {"w": f"its job {waiting.job_id} was cancelled by admin:ops"}


def test_the_job_admins_retry_and_cancel_use_the_framework(admin_client, clean_queue):
    running = enqueue("tests.record", args={"label": "r"})
    make_doing(running.job_id, heartbeat_age_s=0)
    waiting = enqueue("tests.settled", args={"label": "w"})
    url = "/admin/procrastinate/procrastinatejob/"

    response = admin_client.post(
        url, {"action": "retry", "_selected_action": [running.job_id]}, follow=True
    )
    assert status(running.job_id) == "doing"
    assert "run it twice" in response.content.decode()

    admin_client.post(url, {"action": "cancel", "_selected_action": [waiting.job_id]})
    assert status(waiting.job_id) == "cancelled"
    page = admin_client.get(url).content.decode()
    assert 'value="abort"' not in page


def test_enqueue_inserts_what_procrastinates_defer_inserts():
    """procrastinate's defer and ``enqueue`` must insert the same columns (but ``lock``,
    which pgstage never sets): an upgrade that adds one fails here, not in production."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'procrastinate_defer_jobs_v1'")
        (source,) = cursor.fetchone()
        cursor.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = 'procrastinate_jobs' AND is_nullable = 'NO' "
            "AND column_default IS NULL AND is_identity = 'NO'"
        )
        required = {row[0] for row in cursor.fetchall()}

    def columns(sql: str) -> set[str]:
        match = re.search(r"INSERT INTO procrastinate_jobs\s*\(([^)]*)\)", sql)
        assert match, sql
        return {c.strip() for c in match.group(1).split(",")}

    theirs = columns(source)
    inserting = [name for name, sql in queries.items() if "INSERT INTO procrastinate_jobs" in sql]
    assert {"enqueue", "ledger_complete"} <= set(inserting)
    for name in inserting:
        ours = columns(queries[name])
        assert theirs - ours == {"lock"}, name
        assert ours <= theirs, name
        assert required <= ours, name


def test_procrastinate_is_pinned_to_the_tested_minor_version():
    """The worker subclass and the SQL above rely on procrastinate 3.10's internals."""
    assert importlib.metadata.version("procrastinate").startswith("3.10.")


def test_a_task_whose_work_nothing_else_would_do_cannot_be_cancelled(clean_queue):
    job = enqueue("tests.record", args={"label": "x"})
    with pytest.raises(CancelRefused, match=r"\(tests.record\) cannot be cancelled"):
        job_cancel(job_id=job.job_id, actor="admin:ops")
    assert status(job.job_id) == "todo"


def test_retrying_a_failed_job_withdraws_the_give_up_it_still_owes(clean_queue):
    # A worker without the hook gave the job up (stalled recovery, or a worker of another
    # release): the statement recorded the hook as owed, for a worker that has it. Before
    # one settles it, an operator retries the job: it is no longer given up, and its hook
    # must not run behind (or during) its new run.
    job = enqueue("tests.settled", args={"label": "retried"})
    with connection.cursor() as cursor:
        cursor.execute(
            queries["end_stalled_job"],
            {"job_id": job.job_id, "status": "failed", "owed_reason": "its worker died"},
        )
    assert job_retry(job_id=job.job_id).outcome is RetryOutcome.RETRIED
    assert status(job.job_id) == "todo"
    assert giveup.settle_owed() == 0
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pgstage_owed_give_ups WHERE job_id = %s", [job.job_id])
        assert cursor.fetchone()[0] == 0


def test_a_retried_failed_job_wakes_the_workers_listening_on_its_queue(clean_queue):
    """procrastinate notifies workers only when a job is inserted; a failed job put back
    to 'todo' by an operator's retry would wait for the next poll (WORKER_POLLING_SECONDS)
    instead of starting within LISTEN latency, as a requeued stalled job does."""
    job = enqueue("tests.record", args={"label": "woken"})
    fail(job.job_id)
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute('LISTEN "procrastinate_any_queue_v1"')
        assert job_retry(job_id=job.job_id).outcome is RetryOutcome.RETRIED
        payloads = [json.loads(n.payload) for n in listener.notifies(timeout=1, stop_after=1)]
    assert payloads == [{"type": "job_inserted", "job_id": job.job_id}]
