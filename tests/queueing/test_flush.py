"""A claims-first task's fetch commits without its own flush (queueing.flush): the
worker's fetch statement turns ``synchronous_commit`` off for its own commit when the
job it takes is of such a task, and leaves the setting as it is for any other job, or
none. The claim that follows commits as the database says, and its flush carries the
fetch's (the write-ahead log reaches the disk in order)."""

from __future__ import annotations

import psycopg
import pytest
from procrastinate.contrib.django import app

import tests.queueing.tasks  # noqa: F401  (registers the test tasks in this process)
from queueing import flush
from queueing.app import task
from queueing.enqueue import enqueue
from queueing.worker import fetch_by_task_name, queries
from tests.conftest import database_url


def test_the_declared_tasks_and_their_aliases_are_the_ones_sent():
    tasks = {"tests.stage": app.tasks["tests.stage"], "tests.record": app.tasks["tests.record"]}
    tasks["old.name.of.stage"] = app.tasks["tests.stage"]  # an alias: its task's name counts
    assert flush.for_tasks(tasks) == ("old.name.of.stage", "tests.stage")
    assert "tests.stage" in flush.declared()
    assert "tests.record" not in flush.declared()


def test_claims_first_takes_a_bool_only():
    with pytest.raises(TypeError, match="claims_first='yes' must be True or False"):
        task(name="tests.flush.bad", claims_first="yes")
    assert "tests.flush.bad" not in flush.declared()


@pytest.mark.django_db(transaction=True)
def test_only_a_claims_first_jobs_fetch_commits_unflushed(clean_queue):
    first = enqueue("tests.stage", args={"unit": "u", "hold": "/nonexistent"})
    second = enqueue("tests.record", args={"label": "plain"})
    manager = fetch_by_task_name(app)
    with psycopg.connect(database_url(), autocommit=True) as conn:
        (worker_id,) = conn.execute(
            "INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id"
        ).fetchone()
        # A session that asks more than a local flush: what a non-claims-first fetch keeps.
        conn.execute("SET synchronous_commit = remote_write")
        fetched = []
        for _ in range(3):
            row = conn.execute(
                queries["fetch_job"], manager.fetch_params(None, worker_id)
            ).fetchone()
            # The setting was the statement's own: its commit ended it.
            after = conn.execute("SHOW synchronous_commit").fetchone()[0]
            fetched.append((row[0], row[-1], after))
    assert fetched == [
        (first.job_id, "off", "remote_write"),
        (second.job_id, "remote_write", "remote_write"),
        (None, "remote_write", "remote_write"),  # no job left: nothing changes
    ]


def test_the_pipelines_stage_tasks_are_claims_first():
    from pipeline.stages import TASK_NAMES

    assert set(TASK_NAMES.values()) <= flush.declared()


def test_declaring_false_again_discards_and_a_refused_task_records_nothing():
    task(name="tests.flush.redeclared", claims_first=True)
    assert "tests.flush.redeclared" in flush.declared()
    task(name="tests.flush.redeclared", claims_first=False)
    assert "tests.flush.redeclared" not in flush.declared()
    # A timeout refused after a valid claims_first: neither is recorded.
    with pytest.raises(ValueError, match="timeout"):
        task(name="tests.flush.bad_timeout", claims_first=True, timeout=-1)
    assert "tests.flush.bad_timeout" not in flush.declared()


@pytest.mark.django_db(transaction=True)
def test_a_claims_first_fetch_returns_before_its_commit_reaches_the_disk(clean_queue):
    """Right after a claims-first fetch returns, the log's flushed position is, at least
    once in a row of fetches, short of its inserted one: the fetch's commit did not wait
    for its flush. (Any other commit on the server flushes the log, ours included; a row
    of fetches makes it unlikely that every one of them was flushed so.)"""
    manager = fetch_by_task_name(app)
    unflushed = 0
    with psycopg.connect(database_url(), autocommit=True) as conn:
        (worker_id,) = conn.execute(
            "INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id"
        ).fetchone()
        for i in range(30):
            enqueue("tests.stage", args={"unit": f"wal{i}", "hold": "/nonexistent"})
            row = conn.execute(
                queries["fetch_job"], manager.fetch_params(None, worker_id)
            ).fetchone()
            assert row[0] is not None and row[-1] == "off"
            (behind,) = conn.execute(
                "SELECT pg_current_wal_flush_lsn() < pg_current_wal_insert_lsn()"
            ).fetchone()
            unflushed += behind
    assert unflushed > 0
