"""Submitting an inquiry: its files checked, staged and recorded with its intake job in one
transaction, under the tenant's hourly bound (the stages themselves: ``stages.py``)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import PurePath
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import Tenant
from accounts.validation import InvalidText, storable_text
from pipeline import storage
from pipeline.audit import audit_entry_create
from pipeline.exceptions import (
    FileTooLarge,
    InvalidTitle,
    NoFiles,
    TooManyFiles,
    TooManyInquiries,
)
from pipeline.extract import format_by_name, get_extractor, inspect_upload
from pipeline.limits import MAX_FILE_BYTES, MAX_FILES, MAX_TITLE, UNSTORABLE
from pipeline.models import Anfrage, Stage
from pipeline.stages import pipeline_stage_enqueue, unparseable
from pipeline.storage import StagedFile
from queueing import locks

#: Serialises staging a blob (submit) with deleting it (the staging cleanup sweep).
STAGING_LOCK = locks.namespace("pipeline_staging")
#: Serialises a tenant's submits, so its hourly bound holds under concurrency.
SUBMIT_LOCK = locks.namespace("pipeline_submit")
SUBMIT_WINDOW = datetime.timedelta(hours=1)


@dataclass(frozen=True, kw_only=True)
class Upload:
    filename: str
    data: bytes


def _clean_filename(name: str) -> str:
    """The file's own name (no directories), storable, at most 255 characters."""
    name = PurePath((name or "").replace("\\", "/")).name
    return UNSTORABLE.sub("\ufffd", name).strip()[:255] or "upload.txt"


def _checked_count(count: int) -> None:
    if not count:
        raise NoFiles()
    if count > MAX_FILES:
        raise TooManyFiles(f"{count} files; at most {MAX_FILES} per inquiry")


def _checked_title(title: str) -> str:
    try:
        return storable_text((title or "").strip(), field="title", max_length=MAX_TITLE)
    except InvalidText as exc:
        raise InvalidTitle(str(exc)) from None


def anfrage_submit_allowed(*, tenant: Tenant) -> None:
    """Raise :class:`TooManyInquiries` while the tenant is at its hourly bound
    (``MAX_INQUIRIES_PER_TENANT_PER_HOUR``; 0 turns it off). A read without a lock, so a
    request can be refused before its upload is read; :func:`anfrage_submit` checks
    again under the tenant's lock."""
    limit = int(settings.MAX_INQUIRIES_PER_TENANT_PER_HOUR)
    if limit <= 0:
        return
    now = timezone.now()
    # One indexed probe of the limit-th newest inquiry in the window (whatever the limit):
    # when it exists the limit is reached, and the window frees a place when it leaves.
    limit_th = (
        Anfrage.objects.filter(tenant=tenant, created_at__gt=now - SUBMIT_WINDOW)
        .order_by("-created_at")
        .values_list("created_at", flat=True)[limit - 1 : limit]
    )
    oldest = next(iter(limit_th), None)
    if oldest is not None:
        wait = oldest + SUBMIT_WINDOW - now
        raise TooManyInquiries(
            f"the tenant submitted {limit} inquiries in the last hour, its limit; try again later",
            retry_after=max(1, math.ceil(wait.total_seconds())),
        )


def anfrage_submit(
    *, tenant: Tenant, uploads: Sequence[Upload], title: str = "", actor: str
) -> Anfrage:
    """Create an inquiry from bytes in memory (commands, tests) and enqueue its intake.

    Every file is checked first (not empty, not binary, a known format, at least one
    readable line): bad input raises an ``InvalidUpload`` and writes nothing. Then, as
    :func:`anfrage_submit_staged`, under the tenant's hourly bound.
    """
    _checked_count(len(uploads))
    title = _checked_title(title)
    extractor = get_extractor()
    manifest = []
    for upload in uploads:
        filename = _clean_filename(upload.filename)
        if len(upload.data) > MAX_FILE_BYTES:
            raise FileTooLarge(
                f"file {filename!r} has {len(upload.data)} bytes; at most {MAX_FILE_BYTES}"
            )
        source = inspect_upload(filename, upload.data)
        extraction = extractor.extract(source)
        if not extraction.positions:
            raise unparseable(filename, extraction)
        manifest.append(
            {
                "filename": filename,
                "sha256": storage.sha256_hex(upload.data),
                "size": len(upload.data),
                "format": source.format.value,
            }
        )
    blobs = {m["sha256"]: u.data for m, u in zip(manifest, uploads, strict=True)}
    return _anfrage_create(
        tenant=tenant,
        manifest=manifest,
        title=title,
        actor=actor,
        stage={sha256: partial(storage.stage_upload, data) for sha256, data in blobs.items()},
    )


def anfrage_submit_staged(
    *, tenant: Tenant, files: Sequence[StagedFile], title: str = "", actor: str
) -> Anfrage:
    """Create an inquiry from uploads already on disk (``pipeline.uploads`` streamed,
    hashed and checked them: count, size, extension, no NUL byte, not empty) and enqueue
    its intake. The request's work stays proportional to its size: decoding and parsing
    are intake's and extract's, which refuse an unreadable file for good.

    Bad input raises an ``InvalidUpload`` and writes nothing; the rest as
    :func:`anfrage_submit`.
    """
    _checked_count(len(files))
    title = _checked_title(title)
    manifest = []
    for file in files:
        filename = _clean_filename(file.filename)
        if file.size > MAX_FILE_BYTES:
            raise FileTooLarge(f"file {filename!r} has {file.size} bytes; at most {MAX_FILE_BYTES}")
        by_name = format_by_name(filename)
        manifest.append(
            {
                "filename": filename,
                "sha256": file.sha256,
                "size": file.size,
                "format": by_name.value if by_name else None,
            }
        )
    return _anfrage_create(
        tenant=tenant,
        manifest=manifest,
        title=title,
        actor=actor,
        stage={f.sha256: partial(storage.stage_file, f.path, f.sha256) for f in files},
    )


def _anfrage_create(
    *,
    tenant: Tenant,
    manifest: list[dict[str, Any]],
    title: str,
    actor: str,
    stage: dict[str, Callable[[], object]],
) -> Anfrage:
    """One transaction: under the tenant's lock its hourly bound is checked (so two
    concurrent submits cannot both take its last slot); the bytes are staged
    content-addressed under each blob's advisory lock (idempotent; before the row is
    visible, so intake always finds them); the row, its audit entry and the intake job
    commit together."""
    with transaction.atomic():
        locks.xact_lock(SUBMIT_LOCK, tenant.id)
        anfrage_submit_allowed(tenant=tenant)
        # The staging cleanup takes the blob's lock before it deletes a blob nobody
        # references, so it can never delete one that this inquiry (committing below)
        # needs. Sorted, so two submits lock in one order.
        for sha256, write in sorted(stage.items()):
            locks.xact_lock(STAGING_LOCK, sha256)
            write()
        anfrage = Anfrage.objects.create(
            tenant=tenant, title=title or manifest[0]["filename"], uploads=manifest
        )
        audit_entry_create(
            tenant_id=tenant.id,
            entity_type="anfrage",
            entity_id=anfrage.id,
            action="anfrage.submitted",
            actor=actor,
            payload={
                "files": [{"filename": m["filename"], "sha256": m["sha256"]} for m in manifest]
            },
        )
        pipeline_stage_enqueue(anfrage=anfrage, stage=Stage.INTAKE)
    return anfrage
