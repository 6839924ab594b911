"""The staging cleanup sweep: staged bytes go once no inquiry needs them, never sooner."""

from __future__ import annotations

import datetime
import os
import threading
import time

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections, transaction
from django.utils import timezone

from pipeline import storage
from pipeline.models import Anfrage, PipelineRun, Stage
from pipeline.replay import pipeline_stage_replay
from pipeline.submit import STAGING_LOCK
from queueing import locks
from queueing.exceptions import DoNotRetry
from queueing.sweeps import run_sweep
from tests.factories import auth_header
from tests.pipeline.conftest import ITEMS_CSV, ITEMS_TXT, run_stages, submit


def age(sha256: str, hours: float = 48) -> None:
    """Time travel: the staged blob was last touched ``hours`` ago."""
    then = time.time() - hours * 3600
    os.utime(storage.staging_path(sha256), (then, then))


def staged(anfrage) -> list[str]:
    return [m["sha256"] for m in anfrage.uploads]


@pytest.mark.django_db
def test_only_old_blobs_no_pending_intake_needs_are_deleted(tenant):
    done = submit(tenant, {"done.txt": ITEMS_TXT})
    run_stages(done.id, (Stage.INTAKE,))
    waiting = submit(tenant, {"waiting.csv": ITEMS_CSV})
    fresh = submit(tenant, {"fresh.txt": ITEMS_TXT + "5 pcs flat bar S235 40x10, 2 m\n"})
    run_stages(fresh.id, (Stage.INTAKE,))
    for sha in staged(done) + staged(waiting):
        age(sha)

    result = run_sweep("staged_uploads")
    assert (result.selected, result.changed) == (1, 1)
    assert not storage.staging_path(staged(done)[0]).exists()  # intake done, old
    assert storage.staging_path(staged(waiting)[0]).exists()  # intake still to run
    assert storage.staging_path(staged(fresh)[0]).exists()  # inside the grace window
    # The waiting inquiry's intake still finds its bytes.
    assert run_stages(waiting.id, (Stage.INTAKE,)) == ["completed"]


@pytest.mark.django_db
def test_dry_run_deletes_nothing(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE,))
    age(staged(anfrage)[0])
    assert run_sweep("staged_uploads", dry_run=True).selected == 1
    assert storage.staging_path(staged(anfrage)[0]).exists()


@pytest.mark.django_db
def test_a_replayed_intake_after_cleanup_uses_the_stored_copy(tenant):
    anfrage = submit(tenant)
    run_stages(anfrage.id)
    age(staged(anfrage)[0])
    assert run_sweep("staged_uploads").changed == 1
    pipeline_stage_replay(
        tenant_id=tenant.id,
        anfrage_id=anfrage.id,
        stage=Stage.INTAKE,
        force=True,
        cascade=True,
        actor="ops",
    )
    assert run_stages(anfrage.id) == ["completed"] * 4


@pytest.mark.django_db(transaction=True)
def test_a_submit_racing_the_cleanup_keeps_its_bytes(tenant):
    """The cleanup decided to delete a blob and holds its lock; a submit of the same bytes
    waits for the lock and stages them again, so its intake finds them."""
    first = submit(tenant)
    run_stages(first.id, (Stage.INTAKE,))
    sha = staged(first)[0]
    deleting = threading.Event()
    release = threading.Event()

    def cleanup_holding_the_lock():
        try:
            with transaction.atomic():
                locks.xact_lock(STAGING_LOCK, sha)
                storage.delete_staged(sha)
                deleting.set()
                release.wait(timeout=10)
        finally:
            connections.close_all()

    cleaner = threading.Thread(target=cleanup_holding_the_lock)
    cleaner.start()
    assert deleting.wait(timeout=10)
    outcome = {}

    def second_submit():
        try:
            outcome["anfrage"] = submit(tenant)
        finally:
            connections.close_all()

    submitter = threading.Thread(target=second_submit)
    submitter.start()
    submitter.join(timeout=0.5)
    assert submitter.is_alive(), "the submit must wait for the blob's lock"
    release.set()
    cleaner.join(timeout=10)
    submitter.join(timeout=10)
    assert storage.staging_path(sha).exists()
    assert run_stages(outcome["anfrage"].id, (Stage.INTAKE,)) == ["completed"]


@pytest.mark.django_db
def test_an_intake_failed_for_the_whole_grace_period_releases_its_blob(client, user):
    # An upload the request accepts and intake refuses for good (binary, no extension).
    def upload(name: str) -> str:
        data = SimpleUploadedFile(name, b"\x01\x02\x03\x04 12 pcs \x05\x06\x07\x08" + name.encode())
        response = client.post("/api/anfragen", {"files": [data]}, headers=auth_header(user))
        assert response.status_code == 201, response.content
        anfrage_id = response.json()["id"]
        with pytest.raises(DoNotRetry):
            run_stages(anfrage_id, (Stage.INTAKE,))
        return anfrage_id

    long_ago, recent = upload("old"), upload("new")
    PipelineRun.objects.filter(anfrage_id=long_ago).update(
        finished_at=timezone.now() - datetime.timedelta(days=2)
    )
    blobs = {pk: staged(Anfrage.objects.get(pk=pk))[0] for pk in (long_ago, recent)}
    for sha in blobs.values():
        age(sha)

    assert run_sweep("staged_uploads").changed == 1
    assert not storage.staging_path(blobs[long_ago]).exists()
    assert storage.staging_path(blobs[recent]).exists()
