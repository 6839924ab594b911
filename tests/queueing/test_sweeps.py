from __future__ import annotations

import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, connections

from queueing.sweeps import (
    SweepContext,
    SweepResult,
    declare_sweep,
    get_sweep,
    request_sweep,
    run_sweep,
    sweep_rows,
    sweeps,
)
from tests.conftest import jobs
from tests.queueing.models import Swept

SELECT = """
SELECT id, boom FROM test_swept
 WHERE state = 'new' AND touched_at < now() - %(grace)s * interval '1 second'
 ORDER BY touched_at, id
 LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED"""


def mark(row) -> bool:
    row_id, boom = row
    if boom:
        raise RuntimeError("this row is broken")
    # Compare-and-set: only a row still 'new' changes.
    return Swept.objects.filter(pk=row_id, state="new").update(state="done") == 1


@declare_sweep(name="test_swept", cron="* * * * * */30", batch_size=5, grace_default=60)
def sweep_test_rows(ctx: SweepContext) -> SweepResult:
    """Mark old 'new' test rows 'done'."""
    return sweep_rows(ctx, select_sql=SELECT, params={"grace": ctx.grace_seconds}, process=mark)


def make_rows(count: int, *, age_seconds: int = 120, boom_at: set[int] = frozenset()) -> None:
    with connection.cursor() as cursor:
        for i in range(count):
            cursor.execute(
                "INSERT INTO test_swept (state, touched_at, boom) "
                "VALUES ('new', now() - %s * interval '1 second' + %s * interval '1 ms', %s)",
                [age_seconds, i, i in boom_at],
            )


@pytest.mark.django_db
def test_selects_only_rows_past_grace_oldest_first_in_bounded_batches():
    make_rows(7)
    make_rows(3, age_seconds=10)  # inside the grace window: left alone
    first = run_sweep("test_swept")
    assert (first.selected, first.changed, first.failed) == (5, 5, 0)
    second = run_sweep("test_swept")
    assert (second.selected, second.changed) == (2, 2)
    assert Swept.objects.filter(state="new").count() == 3
    oldest_done = Swept.objects.filter(state="done").order_by("touched_at").first()
    assert oldest_done.pk == Swept.objects.order_by("touched_at").first().pk


@pytest.mark.django_db
def test_a_failing_row_does_not_stop_the_batch():
    make_rows(5, boom_at={1})
    result = run_sweep("test_swept")
    assert (result.selected, result.changed, result.failed) == (5, 4, 1)


@pytest.mark.django_db
def test_dry_run_writes_nothing():
    make_rows(3)
    assert run_sweep("test_swept", dry_run=True).selected == 3
    assert Swept.objects.filter(state="new").count() == 3


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_take_disjoint_rows():
    """Sweep A holds its batch's row locks while sweep B selects: B skips them."""
    make_rows(10)
    selected: dict[str, list[int]] = {"a": [], "b": []}
    a_holds_rows = threading.Event()
    b_done = threading.Event()

    def run(name: str) -> None:
        def process(row) -> bool:
            if name == "a" and not selected["a"]:
                a_holds_rows.set()
                b_done.wait(timeout=10)
            selected[name].append(row[0])
            return mark(row)

        try:
            if name == "b":
                a_holds_rows.wait(timeout=10)
            ctx = SweepContext(name=name, batch_size=5, grace_seconds=60)
            sweep_rows(ctx, select_sql=SELECT, params={"grace": 60}, process=process)
        finally:
            if name == "b":
                b_done.set()
            connections.close_all()

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(selected["a"]) == 5 and len(selected["b"]) == 5
    assert set(selected["a"]).isdisjoint(selected["b"])
    assert Swept.objects.filter(state="done").count() == 10


@pytest.mark.django_db(transaction=True)
def test_ticks_never_stack_one_waiting_or_running_job_per_sweep(clean_queue):
    first = request_sweep("test_swept")
    second = request_sweep("test_swept")
    assert first.created and not second.created and first.job_id == second.job_id
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'doing' WHERE id = %s", [first.job_id]
        )
    assert request_sweep("test_swept").created is False
    [job] = jobs()
    assert job["queueing_lock"] == "exclusive/sweep:test_swept"


def test_sweep_is_declared_with_its_tick():
    from procrastinate.contrib.django import app

    assert "test_swept" in sweeps()
    assert get_sweep("test_swept").task_name in app.tasks
    assert "queueing.sweep_tick.test_swept" in app.tasks
    assert get_sweep("stalled_jobs").grace_seconds == 30


@pytest.mark.django_db
def test_sweep_command_prints_counts_and_refuses_bad_names(capsys):
    make_rows(2)
    call_command("sweep", "test_swept")
    out = capsys.readouterr().out
    assert "test_swept" in out and "selected" in out
    with pytest.raises(CommandError, match="no sweep named 'nope'"):
        call_command("sweep", "nope")
    with pytest.raises(CommandError, match="name one sweep or pass --all"):
        call_command("sweep")
    call_command("sweep", "--all", "--dry-run")
    assert "dry run: nothing was written" in capsys.readouterr().out


def test_every_sweep_is_described_by_its_docstrings_whole_first_paragraph():
    from queueing.sweeps import sweeps

    cut = {name: s.description for name, s in sweeps().items() if not s.description.endswith(".")}

    assert cut == {}


@pytest.mark.django_db(transaction=True)
def test_with_commit_each_a_rows_locks_are_gone_before_the_next_row():
    """In one batch, the first row's locks are still held while the second is processed;
    with ``commit_each`` its transaction has committed, and another session can take
    them. A failing row still stops nothing."""
    from queueing import locks

    namespace = locks.namespace("test_commit_each")
    make_rows(3, boom_at={2})

    def free_elsewhere(key: str) -> bool:
        import psycopg

        from tests.conftest import database_url

        with psycopg.connect(database_url(), autocommit=True) as other:
            statement, params = locks.xact_lock_statement(namespace, key)
            try_statement = statement.replace("pg_advisory_xact_lock", "pg_try_advisory_xact_lock")
            other.execute("BEGIN")
            (taken,) = other.execute(try_statement, params).fetchone()
            other.execute("ROLLBACK")
            return taken

    def first_lock_free_at_the_second_row(commit_each: bool) -> bool:
        Swept.objects.update(state="new")
        observed: list[bool] = []

        def process(row) -> bool:
            if not observed and row[0] == first_id:
                locks.xact_lock(namespace, "first")
            elif len(observed) == 0:
                observed.append(free_elsewhere("first"))
            return mark(row)

        ctx = SweepContext(name="test_swept", batch_size=5, grace_seconds=60)
        result = sweep_rows(
            ctx, select_sql=SELECT, params={"grace": 60}, process=process, commit_each=commit_each
        )
        assert (result.selected, result.changed, result.failed) == (3, 2, 1)
        return observed[0]

    first_id = Swept.objects.order_by("touched_at").values_list("pk", flat=True).first()
    assert first_lock_free_at_the_second_row(commit_each=False) is False
    assert first_lock_free_at_the_second_row(commit_each=True) is True
