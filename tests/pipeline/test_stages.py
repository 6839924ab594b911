"""The stage protocol in one process: submit, the four stages, retries, files, leases.

Fault model — at each step, what can die, stall or race; what must hold; the test:

submit
  - bad input: refused, nothing written (test_bad_input_writes_nothing)
claim
  - the same stage run ten times at once: the work is done once
    (test_the_same_stage_run_ten_times_at_once_does_the_work_once)
  - the same stage enqueued ten times at once: one job
    (test_the_same_stage_enqueued_ten_times_at_once_is_one_job)
  - another worker holds a live lease: ``PollLater`` (a poll, no attempt), never a skip;
    once the lease has lapsed the retry takes over
    (test_busy_stage_retries_later_and_an_expired_lease_is_taken_over); the holder's job
    was taken back by stalled recovery: queueing's ledger tests and
    tests/queueing/faults/test_dead_holder.py
  - this run's job was taken back before it claimed (its fetch lost with the server,
    another worker runs it now): nothing claimed or written, a poll (never a success)
    (test_a_run_whose_job_was_taken_back_before_its_claim_does_nothing)
compute
  - the stage raises: the run is ``failed``, the retry takes over
    (test_a_stage_error_marks_the_run_failed_and_the_retry_takes_over); intake's retry
    stores each file once (test_intake_retry_after_a_failure_stores_each_file_once);
    extract's failure keeps the old positions
    (test_extract_failure_keeps_the_old_positions_until_new_ones_commit)
  - an error no retry fixes: the job fails at once
    (test_a_missing_inquiry_is_not_retried,
    test_a_vanished_catalog_item_fails_calculate_without_retries,
    test_a_broken_catalog_is_recorded_on_the_run_and_not_retried)
  - the compute outlasts the lease while its worker lives: the lease is renewed, a second
    claimer is busy (test_a_stage_computing_past_its_lease_is_not_taken_over)
  - the worker stalls past its lease and is taken over: it commits nothing, and its
    renewal never extends the successor's lease
    (test_a_worker_whose_lease_was_taken_over_commits_nothing,
    test_a_stalled_stage_taken_over_never_extends_its_successors_lease)
close
  - intake's file row is committed by another transaction while its INSERT waits for
    it: the audit entry names that row
    (test_intake_names_the_file_row_another_transaction_committed_while_it_waited)
  - extract's write (one statement) fails in the database: the old positions and
    warnings stay (test_a_write_the_database_refuses_keeps_the_old_positions_and_warnings);
    a re-extraction replaces every one of them, in order
    (test_a_re_extraction_replaces_every_position_and_warning_in_order)
  - a migration locks a later stage's tables: an earlier stage runs on, the stage that
    needs them waits (test_a_lock_on_a_later_stages_tables_holds_up_no_earlier_stage)
  - readers during a retry see the old positions until the new ones commit
    (test_readers_see_the_old_positions_while_a_retry_extracts)
  - a replay racing the closing transaction: see ``test_replay.py``
  - the job is lost after a failure: see ``test_resume.py``
"""

from __future__ import annotations

import datetime
import threading

import pytest
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from pipeline import stages, storage
from pipeline.exceptions import (
    BinaryFile,
    EmptyFile,
    FileTooLarge,
    InvalidTitle,
    NoFiles,
    TooManyFiles,
    UnknownFormat,
    UnparseableFile,
)
from pipeline.models import (
    Anfrage,
    AnfrageFile,
    AuditEntry,
    Catalog,
    ExtractionWarning,
    PipelineRun,
    Position,
    Stage,
)
from pipeline.replay import pipeline_stage_replay
from pipeline.stages import LEDGER, StageOutcome, pipeline_stage_enqueue, pipeline_stage_run
from pipeline.submit import Upload, anfrage_submit
from queueing import current
from queueing.exceptions import DoNotRetry, PollLater
from queueing.ledger import Ledger
from tests.conftest import jobs, make_doing, run_concurrently, wait_for
from tests.pipeline.conftest import (
    ITEMS_CSV,
    ITEMS_TXT,
    force_replay,
    in_background,
    run_stages,
    submit,
)
from tests.pipeline.test_replay import wait_until_blocked_on_a_lock


def runs(anfrage) -> dict[str, tuple[str, int]]:
    return {r.stage: (r.status, r.attempts) for r in PipelineRun.objects.filter(anfrage=anfrage)}


def positions(anfrage) -> list[tuple[int, int, str]]:
    return list(
        Position.objects.filter(anfrage=anfrage)
        .order_by("position_index")
        .values_list("id", "position_index", "item")
    )


# --- submit


def test_submit_creates_the_inquiry_stages_the_bytes_and_queues_intake(tenant, storage_root):
    anfrage = submit(tenant, {"items.txt": ITEMS_TXT, "list.csv": ITEMS_CSV}, title="Hall 3")
    assert anfrage.title == "Hall 3"
    assert [m["format"] for m in anfrage.uploads] == ["text", "csv"]
    for entry in anfrage.uploads:
        assert storage.staging_path(entry["sha256"]).read_bytes() in (
            ITEMS_TXT.encode(),
            ITEMS_CSV.encode(),
        )
    [job] = jobs(task_name="pipeline.intake")
    assert job["queueing_lock"] == f"exclusive/intake:acme:{anfrage.id}"
    assert job["args"] == {"anfrage_id": anfrage.id}
    [entry] = AuditEntry.objects.filter(action="anfrage.submitted")
    assert (entry.entity_type, entry.entity_id) == ("anfrage", anfrage.id)


@pytest.mark.parametrize(
    ("uploads", "title", "error"),
    [
        ([], "", NoFiles),
        ([Upload(filename=f"f{i}.txt", data=b"1 pcs beam") for i in range(21)], "", TooManyFiles),
        ([Upload(filename="a.txt", data=b"")], "", EmptyFile),
        ([Upload(filename="a.bin", data=b"\x00\x01\x02")], "", UnknownFormat),
        ([Upload(filename="a.txt", data=b"\x00\x01\x02garbage")], "", BinaryFile),
        ([Upload(filename="a.txt", data=b"please send a quote")], "", UnparseableFile),
        ([Upload(filename="a.txt", data=b"1 pcs beam\n" * 600_000)], "", FileTooLarge),
        ([Upload(filename="a.txt", data=b"1 pcs beam")], "x" * 201, InvalidTitle),
        # One bad file spoils the whole inquiry: nothing of the good one is kept either.
        (
            [Upload(filename="good.txt", data=b"1 pcs beam"), Upload(filename="bad.txt", data=b"")],
            "",
            EmptyFile,
        ),
    ],
)
def test_bad_input_writes_nothing(tenant, storage_root, uploads, title, error):
    with pytest.raises(error):
        anfrage_submit(tenant=tenant, uploads=uploads, title=title, actor="test")
    assert not Anfrage.objects.exists()
    assert not AuditEntry.objects.exists()
    assert jobs() == []
    assert not storage_root.exists()


# --- the stages


def test_four_stages_run_once_each_and_write_a_quote(tenant):
    anfrage = submit(tenant)
    assert run_stages(anfrage.id) == [StageOutcome.COMPLETED] * 4
    assert runs(anfrage) == {s.value: ("success", 1) for s in Stage}
    anfrage.refresh_from_db()
    assert anfrage.quote_total is not None and anfrage.quote_total > 0
    assert anfrage.currency == "EUR"
    assert [p[2] for p in positions(anfrage)] == [
        "steel beam HEA 200",
        "Flachstahl 40x5",
        "Schrauben M12 V2A",
    ]
    # Each stage enqueued the next one, in its own closing transaction.
    assert [j["task_name"] for j in jobs()] == [
        "pipeline.intake",
        "pipeline.extract",
        "pipeline.feasibility",
        "pipeline.calculate",
    ]
    # Running them again is a no-op: the ledger says done.
    assert run_stages(anfrage.id) == [StageOutcome.SKIPPED] * 4
    assert runs(anfrage) == {s.value: ("success", 1) for s in Stage}


def test_partly_parsing_file_keeps_good_positions_and_records_warnings(tenant):
    anfrage = submit(tenant, {"mixed.txt": "12 pcs steel beam HEA 200, 6 m\nwhat?\n3 m Rohr\n"})
    run_stages(anfrage.id)
    assert [p[1] for p in positions(anfrage)] == [1, 2]
    assert list(anfrage.warnings.values_list("line_no", "line")) == [(2, "what?")]


def test_infeasible_positions_are_not_priced(tenant):
    anfrage = submit(tenant, {"a.txt": "12 pcs steel beam HEA 200, 6 m\n1 pcs garden gnome\n"})
    run_stages(anfrage.id)
    beam, gnome = Position.objects.filter(anfrage=anfrage).order_by("position_index")
    assert beam.feasible and beam.total is not None
    assert gnome.feasible is False and gnome.total is None
    assert "no catalog item" in gnome.reason
    anfrage.refresh_from_db()
    assert anfrage.quote_total == beam.total


def test_a_stage_error_marks_the_run_failed_and_the_retry_takes_over(tenant, monkeypatch):
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE])
    real = stages._stage_job

    def broken(**kwargs):
        raise ConnectionError("queue unreachable")

    # The next stage's job is written with the stage's success: fail it there.
    monkeypatch.setattr(stages, "_stage_job", broken)
    with pytest.raises(ConnectionError):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT)
    run = PipelineRun.objects.get(anfrage=anfrage, stage="extract")
    assert (run.status, run.attempts) == ("failed", 1)
    assert run.error == "ConnectionError: queue unreachable"
    # The closing transaction rolled back: no positions, no next job.
    assert not Position.objects.filter(anfrage=anfrage).exists()
    monkeypatch.setattr(stages, "_stage_job", real)
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT) == "completed"
    assert runs(anfrage)["extract"] == ("success", 2)


def test_intake_retry_after_a_failure_stores_each_file_once(tenant, monkeypatch, storage_root):
    anfrage = submit(tenant, {"items.txt": ITEMS_TXT, "list.csv": ITEMS_CSV})
    real = stages._stage_job
    monkeypatch.setattr(
        stages,
        "_stage_job",
        lambda **kw: (_ for _ in ()).throw(ConnectionError("down")),
    )
    with pytest.raises(ConnectionError):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.INTAKE)
    # The bytes are on disk (idempotent), but no row or audit entry committed.
    assert not AnfrageFile.objects.exists()
    assert not AuditEntry.objects.filter(action="file.stored").exists()
    monkeypatch.setattr(stages, "_stage_job", real)
    pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.INTAKE)
    files = list(AnfrageFile.objects.filter(anfrage=anfrage))
    assert len(files) == 2
    for f in files:
        assert f.storage_key == f"acme/{anfrage.id}/{f.sha256}"
        assert storage.read_stored(key=f.storage_key, sha256=f.sha256)
    stored = AuditEntry.objects.filter(action="file.stored")
    assert sorted(e.entity_id for e in stored) == sorted(f.id for f in files)


def test_duplicate_upload_is_one_row_with_consistent_audit_entries(tenant):
    anfrage = submit(tenant, {"items.txt": ITEMS_TXT, "copy-of-items.txt": ITEMS_TXT})
    other = submit(tenant, {"items.txt": ITEMS_TXT})
    run_stages(anfrage.id, [Stage.INTAKE])
    run_stages(other.id, [Stage.INTAKE])
    [row] = AnfrageFile.objects.filter(anfrage=anfrage)
    [other_row] = AnfrageFile.objects.filter(anfrage=other)
    assert row.sha256 == other_row.sha256 and row.storage_key != other_row.storage_key
    entries = list(
        AuditEntry.objects.filter(action="file.stored", payload__anfrage_id=anfrage.id).order_by(
            "id"
        )
    )
    assert [(e.entity_type, e.entity_id, e.payload["created"]) for e in entries] == [
        ("anfrage_file", row.id, True),
        ("anfrage_file", row.id, False),
    ]
    # A forced intake replay adds an entry naming the same existing row, no second row.
    pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage="intake", force=True, actor="test"
    )
    run_stages(anfrage.id, [Stage.INTAKE])
    assert AnfrageFile.objects.filter(anfrage=anfrage).count() == 1
    entries = AuditEntry.objects.filter(action="file.stored", payload__anfrage_id=anfrage.id)
    assert {e.entity_id for e in entries} == {row.id} and entries.count() == 4
    # Invariant: every file entry names a row that exists, every file has an entry.
    file_ids = set(AnfrageFile.objects.values_list("id", flat=True))
    entry_ids = set(
        AuditEntry.objects.filter(entity_type="anfrage_file").values_list("entity_id", flat=True)
    )
    assert entry_ids == file_ids


@pytest.mark.django_db(transaction=True)
def test_intake_names_the_file_row_another_transaction_committed_while_it_waited(tenant):
    """Intake writes its files and their audit entries in one statement, whose snapshot
    lacks a conflicting row committed while its INSERT waited for it: that upload's entry
    is written in a statement of its own, naming that row (invariant 3), never none."""
    anfrage = submit(tenant)
    [upload] = anfrage.uploads
    key = storage.storage_key(
        tenant_slug=tenant.slug, anfrage_id=anfrage.id, sha256=upload["sha256"]
    )
    inserted, release = threading.Event(), threading.Event()

    def rival() -> int:
        with transaction.atomic():
            row = AnfrageFile.objects.create(
                tenant=tenant,
                anfrage=anfrage,
                sha256=upload["sha256"],
                storage_key=key,
                size=upload["size"],
                filename="rival.txt",
                format="text",
            )
            inserted.set()
            assert release.wait(timeout=30), "the test never released the rival"
        return row.id

    rival_thread, rival_outcome = in_background(rival)
    assert inserted.wait(timeout=20)
    intake, intake_outcome = in_background(
        lambda: pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.INTAKE)
    )
    wait_until_blocked_on_a_lock()
    release.set()
    rival_thread.join(timeout=20)
    intake.join(timeout=20)
    assert intake_outcome == [StageOutcome.COMPLETED]
    [row] = AnfrageFile.objects.filter(anfrage=anfrage)
    assert rival_outcome == [row.id]
    [entry] = AuditEntry.objects.filter(action="file.stored", payload__anfrage_id=anfrage.id)
    assert (entry.entity_id, entry.payload["created"], entry.payload["filename"]) == (
        row.id,
        False,
        upload["filename"],
    )


@pytest.mark.django_db(transaction=True)
def test_a_lock_on_a_later_stages_tables_holds_up_no_earlier_stage(tenant):
    """A stage's first statement reads only the tables of its input: while a migration
    holds the positions and the catalogs, intake still runs (and extract waits)."""
    anfrage = submit(tenant)
    locked, release = threading.Event(), threading.Event()

    def migration() -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                "LOCK TABLE anfrage_positions, catalogs, catalog_items IN ACCESS EXCLUSIVE MODE"
            )
            locked.set()
            assert release.wait(timeout=30), "the test never released the lock"

    holder, _ = in_background(migration)
    assert locked.wait(timeout=20)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")
        assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.INTAKE) == "completed"
        with pytest.raises(OperationalError, match="lock timeout"):
            with connection.cursor() as cursor:
                cursor.execute("SET lock_timeout = '100ms'")
            pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT)
    finally:
        release.set()
        holder.join(timeout=20)
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT) == "completed"


def test_extract_failure_keeps_the_old_positions_until_new_ones_commit(tenant, scripted_extractor):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    before = positions(anfrage)
    assert len(before) == 3
    force_replay(tenant, anfrage, Stage.EXTRACT)
    scripted_extractor.fail_with = RuntimeError("extractor down")
    with pytest.raises(RuntimeError):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT)
    run = PipelineRun.objects.get(anfrage=anfrage, stage="extract")
    assert (run.status, run.error) == ("failed", "RuntimeError: extractor down")
    assert positions(anfrage) == before
    scripted_extractor.fail_with = None
    scripted_extractor.keep = 1
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT) == "completed"
    after = positions(anfrage)
    assert [p[1:] for p in after] == [before[0][1:]]
    assert after[0][0] != before[0][0]


def warnings_of(anfrage) -> list[tuple[int, int, str]]:
    return list(
        ExtractionWarning.objects.filter(anfrage=anfrage)
        .order_by("id")
        .values_list("id", "line_no", "message")
    )


def test_a_re_extraction_replaces_every_position_and_warning_in_order(tenant):
    """Extract replaces the positions and warnings in one statement, DELETE before INSERT:
    the same indexes come back as new rows, and warnings keep the order of their lines."""
    lines = []
    for i in range(1, 31):
        lines.append(f"{i} pcs steel beam HEA 200, 6 m")
        if i % 10 == 0:
            lines.append(f"line {i} that is no item")
    anfrage = submit(tenant, {"items.txt": "\n".join(lines) + "\n"})
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT))
    before, warned = positions(anfrage), warnings_of(anfrage)
    assert [p[1] for p in before] == list(range(1, 31)) and len(warned) == 3
    force_replay(tenant, anfrage, Stage.EXTRACT)
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT) == "completed"
    after, rewarned = positions(anfrage), warnings_of(anfrage)
    assert [p[1:] for p in after] == [p[1:] for p in before]
    assert not {p[0] for p in after} & {p[0] for p in before}
    assert [w[1:] for w in rewarned] == [w[1:] for w in warned]
    assert [w[1] for w in rewarned] == [11, 22, 33]
    assert not {w[0] for w in rewarned} & {w[0] for w in warned}


@pytest.mark.django_db(transaction=True)
def test_a_write_the_database_refuses_keeps_the_old_positions_and_warnings(tenant, settings):
    """The closing transaction fails as a whole (here at its COMMIT, where the database
    checks the positions' foreign key to their file): the DELETEs of the statement that
    replaced them are undone too."""
    anfrage = submit(tenant, {"items.txt": ITEMS_TXT + "no item here\n"})
    run_stages(anfrage.id)
    before, warned = positions(anfrage), warnings_of(anfrage)
    assert len(before) == 3 and len(warned) == 1
    force_replay(tenant, anfrage, Stage.EXTRACT)
    settings.PIPELINE_EXTRACTOR = "tests.pipeline.extractors.StrayExtractor"
    with pytest.raises(IntegrityError):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT)
    run = PipelineRun.objects.get(anfrage=anfrage, stage="extract")
    assert run.status == "failed" and "a database error" in run.error
    assert (positions(anfrage), warnings_of(anfrage)) == (before, warned)


def test_a_missing_inquiry_is_not_retried(db):
    with pytest.raises(DoNotRetry):
        pipeline_stage_run(anfrage_id=999_999, stage=Stage.INTAKE)


def test_a_vanished_catalog_item_fails_calculate_without_retries(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY])
    Position.objects.filter(anfrage=anfrage).update(catalog_item="discontinued")
    with pytest.raises(DoNotRetry, match="replay feasibility"):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE)
    assert runs(anfrage)["calculate"] == ("failed", 1)


def test_a_quote_too_large_to_store_fails_calculate_without_retries(tenant):
    # 999,999,999 beams of 12 m cost 431,999,999,568.00 each: three pass the 10^12 a
    # quote holds. It was a numeric overflow in the closing transaction, shown as "a
    # database error" and retried for nothing.
    anfrage = submit(tenant, {"a.txt": "999.999.999 Stk Träger HEA 200, 12 m\n" * 3})
    run_stages(anfrage.id, [Stage.INTAKE, Stage.EXTRACT, Stage.FEASIBILITY])
    with pytest.raises(DoNotRetry, match="too large"):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.CALCULATE)
    run = PipelineRun.objects.get(anfrage=anfrage, stage="calculate")
    assert run.status == "failed" and run.error.startswith("QuoteTooLarge: ")
    assert Anfrage.objects.get(pk=anfrage.id).quote_total is None


def test_a_broken_catalog_is_recorded_on_the_run_and_not_retried(tenant):
    Catalog.objects.create(tenant=tenant, name="empty", materials={})
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE, Stage.EXTRACT])
    with pytest.raises(DoNotRetry, match="needs materials"):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.FEASIBILITY)
    run = PipelineRun.objects.get(anfrage=anfrage, stage="feasibility")
    assert run.status == "failed" and run.error.startswith("InvalidCatalog: ")


def test_busy_stage_retries_later_and_an_expired_lease_is_taken_over(tenant):
    anfrage = submit(tenant)
    claim = LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="intake")
    assert claim.claimed
    with pytest.raises(PollLater):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.INTAKE)
    PipelineRun.objects.filter(pk=claim.entry_id).update(
        lease_expires_at=timezone.now() - datetime.timedelta(seconds=1)
    )
    assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.INTAKE) == "completed"
    assert runs(anfrage)["intake"] == ("success", 2)


# --- concurrency (committed data, real concurrent connections)


@pytest.mark.django_db(transaction=True)
def test_the_same_stage_run_ten_times_at_once_does_the_work_once(clean_queue, tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE])
    results = run_concurrently(
        lambda i: pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT), 10
    )
    completed = [r for r in results if r == StageOutcome.COMPLETED]
    others = [r for r in results if r != StageOutcome.COMPLETED]
    assert len(completed) == 1, results
    assert all(r == StageOutcome.SKIPPED or isinstance(r, PollLater) for r in others), results
    assert runs(anfrage)["extract"] == ("success", 1)
    assert len(positions(anfrage)) == 3
    assert len(jobs(task_name="pipeline.feasibility")) == 1


@pytest.mark.django_db(transaction=True)
def test_the_same_stage_enqueued_ten_times_at_once_is_one_job(clean_queue, tenant):
    anfrage = submit(tenant)
    results = run_concurrently(
        lambda i: pipeline_stage_enqueue(anfrage=anfrage, stage=Stage.EXTRACT), 10
    )
    assert sum(r.created for r in results) == 1, results
    assert len({r.job_id for r in results}) == 1
    assert len(jobs(task_name="pipeline.extract")) == 1


@pytest.mark.django_db(transaction=True)
def test_readers_see_the_old_positions_while_a_retry_extracts(
    clean_queue, tenant, scripted_extractor, blocked_extract
):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    before = positions(anfrage)
    force_replay(tenant, anfrage, Stage.EXTRACT)
    thread, outcome = blocked_extract(anfrage, keep=2)
    assert positions(anfrage) == before
    assert runs(anfrage)["extract"] == ("running", 2)
    scripted_extractor.release.set()
    thread.join(timeout=20)
    assert outcome == [StageOutcome.COMPLETED]
    assert [p[1] for p in positions(anfrage)] == [1, 2]


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_job_was_taken_back_before_its_claim_does_nothing(clean_queue, tenant):
    """The extract job's run lost its job before it claimed (a fetch lost with a crashed
    server; another worker runs the job now): it claims nothing, writes nothing and polls
    (a success saved for it would end a job whose stage never ran); the job's live run
    then does the stage."""
    anfrage = submit(tenant)
    run_stages(anfrage.id, stages=(Stage.INTAKE,))
    job = jobs(task_name="pipeline.extract")[0]["id"]
    old = make_doing(job, heartbeat_age_s=0)
    live = make_doing(job, heartbeat_age_s=0)
    with current.running(job, run=_run(job, old)), pytest.raises(PollLater):
        pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT)
    assert "extract" not in runs(anfrage) and positions(anfrage) == []
    with current.running(job, run=_run(job, live)):
        assert pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT) == (
            StageOutcome.COMPLETED
        )
    assert runs(anfrage)["extract"] == ("success", 1)


def _run(job_id: int, worker_id: int) -> current.JobRun:
    return current.JobRun(
        job_id=job_id,
        attempts=0,
        worker=lambda: worker_id,
        delete_on_success=False,
        commit_within_seconds=30,
        saved=lambda: None,
    )


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_lease_was_taken_over_commits_nothing(
    clean_queue, tenant, scripted_extractor, blocked_extract
):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    before = positions(anfrage)
    force_replay(tenant, anfrage, Stage.EXTRACT)
    thread, outcome = blocked_extract(anfrage, keep=1)
    # The slow worker's lease expires and a successor claims the stage (token 3).
    PipelineRun.objects.filter(anfrage=anfrage, stage="extract").update(
        lease_expires_at=timezone.now() - datetime.timedelta(seconds=1)
    )
    successor = LEDGER.claim(tenant=tenant.id, anfrage=anfrage.id, stage="extract")
    assert successor.token == 3
    scripted_extractor.release.set()
    thread.join(timeout=20)
    assert outcome == [StageOutcome.LEASE_LOST]
    assert positions(anfrage) == before
    assert runs(anfrage)["extract"] == ("running", 3)


# --- lease renewal: a live worker keeps its stage however long it computes


def lease_is_live(anfrage, stage: Stage) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lease_expires_at > now() FROM pipeline_runs "
            "WHERE anfrage_id = %s AND stage = %s",
            [anfrage.id, stage.value],
        )
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_a_stage_computing_past_its_lease_is_not_taken_over(
    clean_queue, tenant, scripted_extractor, blocked_extract, settings
):
    settings.PIPELINE_LEASE_SECONDS = 1.5
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE])
    thread, outcome = blocked_extract(anfrage)
    # The compute has outlasted its lease; the live worker's renewal extends it again.
    PipelineRun.objects.filter(anfrage=anfrage, stage="extract").update(
        lease_expires_at=timezone.now() - datetime.timedelta(seconds=1)
    )
    wait_for(lambda: lease_is_live(anfrage, Stage.EXTRACT), timeout=10, message="a renewal")
    [second] = run_concurrently(
        lambda i: pipeline_stage_run(anfrage_id=anfrage.id, stage=Stage.EXTRACT), 1
    )
    assert isinstance(second, PollLater), second
    scripted_extractor.release.set()
    thread.join(timeout=20)
    assert outcome == [StageOutcome.COMPLETED]
    assert runs(anfrage)["extract"] == ("success", 1)


@pytest.mark.django_db(transaction=True)
def test_a_stalled_stage_taken_over_never_extends_its_successors_lease(
    clean_queue, tenant, scripted_extractor, blocked_extract, settings, monkeypatch
):
    settings.PIPELINE_LEASE_SECONDS = 1.5
    real_renew = Ledger.renew
    renewals: list[tuple[int, bool]] = []

    def spy(self, claim, **kwargs):
        renewed = real_renew(self, claim, **kwargs)
        renewals.append((claim.token, renewed))
        return renewed

    monkeypatch.setattr(Ledger, "renew", spy)
    anfrage = submit(tenant)
    run_stages(anfrage.id, [Stage.INTAKE])
    thread, outcome = blocked_extract(anfrage)
    # The worker stalls past its lease and a successor takes over (token 2).
    with transaction.atomic():
        PipelineRun.objects.filter(anfrage=anfrage, stage="extract").update(
            lease_expires_at=timezone.now() - datetime.timedelta(seconds=1)
        )
        successor = LEDGER.claim(
            tenant=tenant.id, anfrage=anfrage.id, stage="extract", lease_seconds=300
        )
    assert successor.token == 2
    successor_lease = PipelineRun.objects.get(pk=successor.entry_id).lease_expires_at
    wait_for(lambda: (1, False) in renewals, timeout=10, message="the stale worker's renewal")
    assert PipelineRun.objects.get(pk=successor.entry_id).lease_expires_at == successor_lease
    scripted_extractor.release.set()
    thread.join(timeout=20)
    assert outcome == [StageOutcome.LEASE_LOST]
    assert runs(anfrage)["extract"] == ("running", 2)
    assert not Position.objects.filter(anfrage=anfrage).exists()
