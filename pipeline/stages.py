"""Running a stage of an inquiry (submitting one: ``submit.py``; replays: ``replay.py``).

Every stage runs the same protocol (:func:`pipeline_stage_run`):

1. read the inquiry, the stage before's token and the stage's input in one statement,
   then claim ``(tenant, anfrage, stage)`` in the ledger in another, committed before
   the work starts: *done* skips, *busy* retries later;
2. compute outside any transaction (a crash here changes nothing in the database), while
   a background thread renews the lease every third of ``PIPELINE_LEASE_SECONDS``, so a
   live worker is never taken over however long it computes;
3. in ONE transaction: check that the stage before is still ``success`` with the token
   it had when the input was read (share-locked, ``Ledger.hold``), write the results,
   then mark the run ``success`` (compare-and-set on the fencing token) and enqueue the
   next stage (EXCLUSIVE key ``stage:tenant:anfrage``) in one statement
   (``Ledger.complete(then=...)``);
4. on an error: mark the run ``failed`` with the message and re-raise, so the framework
   retries with its jittered backoff (the ledger row stays claimable).
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from decimal import Decimal
from functools import cache
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from psycopg import sql as psql

from pipeline import storage
from pipeline.audit import audit_entry_create
from pipeline.catalog import (
    CatalogSpec,
    catalog_from_document,
    check_position,
    default_catalog,
    price_position,
)
from pipeline.exceptions import (
    PipelineError,
    QuoteTooLarge,
    StageInputChanged,
    StageInputStale,
    StageSuperseded,
    TooManyPositions,
    UnparseableFile,
)
from pipeline.extract import (
    Extraction,
    ParsedPosition,
    get_extractor,
    inspect_upload,
    read_source,
)
from pipeline.limits import MAX_AMOUNT, MAX_POSITIONS, MAX_WARNINGS, UNSTORABLE
from pipeline.models import (
    Anfrage,
    AnfrageFile,
    ExtractionWarning,
    FileFormat,
    PipelineRun,
    Position,
    Stage,
    Unit,
)
from pipeline.queries import QUERIES
from pipeline.selectors import parse_stage
from queueing import sql
from queueing.enqueue import Enqueued, Policy, enqueue, job_params
from queueing.exceptions import DoNotRetry, LeaseLost, PollLater, PrerequisiteChanged
from queueing.keys import KeyFormat
from queueing.ledger import Claim, Ledger, LedgerStatus, Outcome, Prerequisite
from queueing.rows import insert_or_get

logger = logging.getLogger(__name__)

#: The singleton key of every stage job, e.g. ``extract:acme:42``.
STAGE_KEY = KeyFormat(parts=("stage", "tenant", "anfrage"))
LEDGER = Ledger(model=PipelineRun, key_fields=("tenant", "anfrage", "stage"))
TASK_NAMES = {stage: f"pipeline.{stage.value}" for stage in Stage}
#: Bounds of the position and warning columns an extractor's output goes into.
MAX_STORED_QUANTITY = Decimal(10) ** 12
MAX_STORED_INT = 2**31 - 1
MAX_LINE_CHARS = 1000
_UNITS = frozenset(Unit.values)
MAX_ERROR_CHARS = 2000
WORKER_ACTOR = "worker"


class StageOutcome(enum.StrEnum):
    COMPLETED = "completed"
    SKIPPED = "skipped"
    LEASE_LOST = "lease_lost"
    SUPERSEDED = "superseded"


def lease_seconds() -> float:
    """A stage's lease (``PIPELINE_LEASE_SECONDS``): renewed while the stage computes, so
    it only bounds how long a dead worker's stage waits before another worker takes over."""
    return float(settings.PIPELINE_LEASE_SECONDS)


def stage_key(*, stage: Stage, anfrage: Anfrage) -> str:
    return _key(stage=stage, tenant_slug=anfrage.tenant.slug, anfrage_id=anfrage.id)


def _key(*, stage: Stage, tenant_slug: str, anfrage_id: int) -> str:
    return STAGE_KEY.build(stage=stage.value, tenant=tenant_slug, anfrage=anfrage_id)


def pipeline_stage_enqueue(*, anfrage: Anfrage, stage: Stage) -> Enqueued:
    """Enqueue ``stage`` of ``anfrage`` inside the caller's transaction. EXCLUSIVE: at most
    one waiting-or-running job per stage key; a duplicate returns the existing job."""
    return enqueue(
        TASK_NAMES[stage],
        args={"anfrage_id": anfrage.id},
        key=stage_key(stage=stage, anfrage=anfrage),
        policy=Policy.EXCLUSIVE,
    )


def _stage_job(*, anfrage: _Inquiry, stage: Stage) -> dict[str, Any]:
    """The next stage's job as the ledger's complete enqueues it (same task, args, key
    and policy as :func:`pipeline_stage_enqueue`)."""
    return job_params(
        TASK_NAMES[stage],
        args={"anfrage_id": anfrage.id},
        key=_key(stage=stage, tenant_slug=anfrage.tenant_slug, anfrage_id=anfrage.id),
        policy=Policy.EXCLUSIVE,
    )


def unparseable(filename: str, extraction: Extraction) -> UnparseableFile:
    problems = "; ".join(f"line {w.line_no}: {w.message}" for w in extraction.warnings[:3])
    return UnparseableFile(
        f"file {filename!r}: no line reads as a requested item"
        + (f" ({problems})" if problems else "")
    )


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


# --- the four stages: prepare (the input, as the stage's first statement read it) /
# --- compute (no writes) / write (in the closing transaction, beside ledger.complete and
# --- the next enqueue)


class _Reads(enum.Enum):
    """What a stage's first statement reads beside the inquiry: the ``stage_input_*``
    block it completes ``stage_input`` with."""

    MANIFEST = "manifest"  # the upload manifest, a column of the inquiry
    FILES = "files"
    POSITIONS = "positions"  # the tenant's catalog is read after the claim


_STAGE_INPUT = {
    reads: sql.render(QUERIES["stage_input"], input=psql.SQL(QUERIES[f"stage_input_{reads.value}"]))
    for reads in _Reads
}


@dataclass(frozen=True, kw_only=True)
class _Inquiry:
    """The inquiry as a stage's first statement read it: its tenant's slug, the stage
    before's status and token, and the stage's input (None: not this stage's)."""

    id: int
    tenant_id: int
    tenant_slug: str
    previous_status: str | None
    previous_token: int | None
    uploads: list[dict] | None = None
    files: list[dict] | None = None
    positions: list[dict] | None = None
    #: The tenant's own catalog as a JSON document (None: it has none, or not read).
    catalog: str | None = None


@dataclass(slots=True, kw_only=True)
class _StagePosition:
    """A position as feasibility and calculate read it, and what they decide for it."""

    id: int
    position_index: int
    item: str
    quantity: Decimal
    unit: str
    material: str
    length_mm: int | None
    catalog_item: str
    feasible: bool | None
    reason: str = ""
    catalog_material: str = ""
    unit_price: Decimal | None = None
    total: Decimal | None = None


@dataclass(frozen=True)
class _StageWork:
    reads: _Reads
    prepare: Callable[[_Inquiry], tuple[Any, str]]
    compute: Callable[[_Inquiry, Any], Any]
    #: Sends the results (no result read: the closing transaction's statements travel in
    #: one round trip); may return what to run once they are back.
    write: Callable[[_Inquiry, Any], Callable[[], None] | None]


def _intake_prepare(anfrage: _Inquiry) -> tuple[list[dict], str]:
    manifest = list(anfrage.uploads or [])
    return manifest, _digest([m["sha256"] for m in manifest])


def _intake_compute(anfrage: _Inquiry, manifest: list[dict]) -> list[dict]:
    # Decoding decides what the upload request only screened (binary, encoding, format
    # of a file without an extension): an unreadable file fails intake for good.
    stored = []
    for entry in manifest:
        key = storage.storage_key(
            tenant_slug=anfrage.tenant_slug, anfrage_id=anfrage.id, sha256=entry["sha256"]
        )
        data = storage.read_staged(sha256=entry["sha256"], key=key)
        source = inspect_upload(entry["filename"], data)
        storage.store(key=key, data=data)
        stored.append(
            {**entry, "storage_key": key, "size": len(data), "format": source.format.value}
        )
    return stored


def _intake_write(anfrage: _Inquiry, stored: list[dict]) -> Callable[[], None]:
    # The files and their audit entries in one statement (``intake_write``): the distinct
    # files in upload order (the first upload of the same bytes names the row), and per
    # upload its file's number and whether it is that file's first upload.
    numbers: dict[tuple[str, str], int] = {}
    distinct: list[dict] = []
    upload_files, upload_first = [], []
    for entry in stored:
        key = (entry["sha256"], entry["storage_key"])
        first = key not in numbers
        if first:
            distinct.append(entry)
            numbers[key] = len(distinct)
        upload_files.append(numbers[key])
        upload_first.append(first)
    cursor = sql.statement_cursor(connection)
    cursor.execute(
        QUERIES["intake_write"],
        {
            "tenant_id": anfrage.tenant_id,
            "anfrage_id": anfrage.id,
            "actor": WORKER_ACTOR,
            "sha256s": [f["sha256"] for f in distinct],
            "storage_keys": [f["storage_key"] for f in distinct],
            "sizes": [f["size"] for f in distinct],
            "filenames": [f["filename"] for f in distinct],
            "formats": [f["format"] for f in distinct],
            "upload_files": upload_files,
            "upload_filenames": [e["filename"] for e in stored],
            "upload_first": upload_first,
        },
    )

    def settle() -> None:
        with cursor:
            unsettled = [n for (n,) in cursor.fetchall()]
        for n in unsettled:
            # Its row was committed by another transaction while the statement waited for
            # it: a statement of its own sees it (or raises RowVanished).
            _file_stored(anfrage, stored[n - 1])

    return settle


def _file_stored(anfrage: _Inquiry, entry: dict) -> None:
    """One upload's file row (``insert_or_get``) and its audit entry, in two statements."""
    file_id, created = insert_or_get(
        AnfrageFile,
        values={
            "tenant": anfrage.tenant_id,
            "anfrage": anfrage.id,
            "sha256": entry["sha256"],
            "storage_key": entry["storage_key"],
            "size": entry["size"],
            "filename": entry["filename"],
            "format": entry["format"],
        },
        conflict_fields=("sha256", "storage_key"),
    )
    audit_entry_create(
        tenant_id=anfrage.tenant_id,
        entity_type="anfrage_file",
        entity_id=file_id,
        action="file.stored",
        actor=WORKER_ACTOR,
        payload={
            "anfrage_id": anfrage.id,
            "created": created,
            "filename": entry["filename"],
            "sha256": entry["sha256"],
            "storage_key": entry["storage_key"],
        },
    )


def _extract_prepare(anfrage: _Inquiry) -> tuple[list[dict], str]:
    files = anfrage.files or []
    return files, _digest([f["sha256"] for f in files])


@dataclass(frozen=True, slots=True)
class _PositionRow:
    """A position extract writes, fitted to its columns."""

    position_index: int
    source_file_id: int | None
    source_line: int
    label: str
    raw: str
    quantity: Decimal
    unit: str
    item: str
    material: str
    length_mm: int | None


@dataclass(frozen=True, slots=True)
class _WarningRow:
    """A warning extract writes, fitted to its columns."""

    source_file_id: int | None
    line_no: int
    line: str
    message: str


def _extract_compute(
    anfrage: _Inquiry, files: list[dict]
) -> tuple[list[_PositionRow], list[_WarningRow]]:
    extractor = get_extractor()
    positions: list[_PositionRow] = []
    warnings: list[_WarningRow] = []
    for file in files:
        data = storage.read_stored(key=file["storage_key"], sha256=file["sha256"])
        source = read_source(
            file_id=file["id"],
            filename=file["filename"],
            data=data,
            format=FileFormat(file["format"]),
        )
        extraction = extractor.extract(source)
        if not extraction.positions:
            raise unparseable(file["filename"], extraction)
        for parsed in extraction.positions:
            row, notes = _position_row(parsed, index=len(positions) + 1)
            if row is not None:
                positions.append(row)
            if notes:
                warnings.append(
                    _warning_row(parsed.file_id, parsed.line_no, parsed.raw, "; ".join(notes))
                )
            if len(positions) > MAX_POSITIONS:
                raise TooManyPositions(
                    f"the inquiry's files hold more than {MAX_POSITIONS:,} positions; "
                    "split it into several inquiries"
                )
        warnings.extend(
            _warning_row(w.file_id, w.line_no, w.line, w.message)
            for w in sorted((*source.warnings, *extraction.warnings), key=lambda w: w.line_no)
        )
    if len(warnings) > MAX_WARNINGS:
        dropped = len(warnings) - (MAX_WARNINGS - 1)
        warnings = warnings[: MAX_WARNINGS - 1]
        warnings.append(
            _warning_row(None, 0, "", f"and {dropped:,} more line(s) that could not be read")
        )
    return positions, warnings


@cache
def _column(model: type, name: str) -> int:
    return model._meta.get_field(name).max_length


def _fit(value: object, *, model: type, field: str, cut: list[str]) -> str:
    """``value`` as storable text that fits ``model.field``; a cut is noted in ``cut``."""
    text = UNSTORABLE.sub("\ufffd", str(value if value is not None else ""))
    limit = _column(model, field)
    if len(text) > limit:
        cut.append(f"{field} cut to {limit} characters")
        text = text[:limit]
    return text


def _position_row(parsed: ParsedPosition, *, index: int) -> tuple[_PositionRow | None, list[str]]:
    """The position as a row that fits its columns, and what had to give.

    Whatever a (plugged) extractor returns: over-long text is cut, and a quantity, unit or
    length the columns cannot hold refuses the position; either becomes a warning the
    tenant sees, instead of failing the stage on the database's error."""
    cut: list[str] = []
    quantity = parsed.quantity
    if not isinstance(quantity, Decimal) or not quantity.is_finite():
        return None, [f"position refused: quantity {quantity!r} is not a number"]
    if not 0 < quantity < MAX_STORED_QUANTITY:
        return None, [f"position refused: quantity {quantity} is out of range"]
    if parsed.unit not in _UNITS:
        return None, [f"position refused: unknown unit {parsed.unit!r}"]
    length = parsed.length_mm
    if length is not None and not (isinstance(length, int) and 0 < length <= MAX_STORED_INT):
        return None, [f"position refused: length {length!r} mm is out of range"]
    item = _fit(parsed.item, model=Position, field="item", cut=cut).strip()
    if not item:
        return None, ["position refused: it names no item"]
    row = _PositionRow(
        position_index=index,
        source_file_id=parsed.file_id,
        source_line=max(0, min(int(parsed.line_no), MAX_STORED_INT)),
        label=_fit(parsed.label, model=Position, field="label", cut=cut),
        raw=UNSTORABLE.sub("\ufffd", str(parsed.raw))[:MAX_LINE_CHARS],
        quantity=quantity.quantize(Decimal("0.001")),
        unit=parsed.unit,
        item=item,
        material=_fit(parsed.material, model=Position, field="material", cut=cut),
        length_mm=length,
    )
    return row, [f"position {index}: {'; '.join(cut)}"] if cut else []


def _warning_row(file_id: int | None, line_no: int, line: str, message: str) -> _WarningRow:
    return _WarningRow(
        source_file_id=file_id,
        line_no=max(0, min(int(line_no), MAX_STORED_INT)),
        line=UNSTORABLE.sub("\ufffd", str(line))[:MAX_LINE_CHARS],
        message=_fit(message, model=ExtractionWarning, field="message", cut=[]),
    )


def _extract_write(anfrage: _Inquiry, result: tuple[list[_PositionRow], list[_WarningRow]]) -> None:
    positions, warnings = result
    # One statement (``extract_write``): the positions and warnings replaced, DELETE
    # before INSERT, in this (the closing) transaction: until it commits, readers and a
    # failed attempt see the previous ones; and the old quote cleared, as new positions
    # invalidate it.
    with sql.statement_cursor(connection) as cursor:
        cursor.execute(
            QUERIES["extract_write"],
            {
                "tenant_id": anfrage.tenant_id,
                "anfrage_id": anfrage.id,
                "indexes": [p.position_index for p in positions],
                "files": [p.source_file_id for p in positions],
                "lines": [p.source_line for p in positions],
                "labels": [p.label for p in positions],
                "raws": [p.raw for p in positions],
                "quantities": [p.quantity for p in positions],
                "units": [p.unit for p in positions],
                "items": [p.item for p in positions],
                "materials": [p.material for p in positions],
                "lengths": [p.length_mm for p in positions],
                "warning_files": [w.source_file_id for w in warnings],
                "warning_lines": [w.line_no for w in warnings],
                "warning_texts": [w.line for w in warnings],
                "warning_messages": [w.message for w in warnings],
            },
        )


def _positions_prepare(anfrage: _Inquiry) -> tuple[list[_StagePosition], str]:
    positions = [
        _StagePosition(
            id=p["id"],
            position_index=p["position_index"],
            item=p["item"],
            quantity=Decimal(p["quantity"]),
            unit=p["unit"],
            material=p["material"],
            length_mm=p["length_mm"],
            catalog_item=p["catalog_item"],
            feasible=p["feasible"],
        )
        for p in anfrage.positions or []
    ]
    # Row ids are part of the input: a re-extraction writes new rows (even with the same
    # content), and results written by id to the old rows would be lost.
    digest = _digest(
        [
            [
                p.id,
                p.position_index,
                p.item,
                p.quantity,
                p.unit,
                p.material,
                p.length_mm,
                p.catalog_item,
                p.feasible,
            ]
            for p in positions
        ]
    )
    return positions, digest


def _stage_catalog(anfrage: _Inquiry) -> CatalogSpec:
    """The tenant's catalog as the stage's first statement read it (validated here, after
    the claim, so a broken catalog is recorded on the run), else the default."""
    if anfrage.catalog is None:
        return default_catalog()
    return catalog_from_document(anfrage.catalog)


def _feasibility_compute(
    anfrage: _Inquiry, positions: list[_StagePosition]
) -> list[_StagePosition]:
    catalog = _stage_catalog(anfrage)
    for position in positions:
        verdict = check_position(
            catalog,
            item=position.item,
            quantity=position.quantity,
            unit=position.unit,
            material=position.material,
            length_mm=position.length_mm,
        )
        position.feasible = verdict.feasible
        position.reason = verdict.reason[:300]
        position.catalog_item = verdict.catalog_item
        position.catalog_material = verdict.catalog_material
        position.unit_price = None
        position.total = None
    return positions


def _feasibility_write(anfrage: _Inquiry, positions: list[_StagePosition]) -> None:
    with sql.statement_cursor(connection) as cursor:
        cursor.execute(
            QUERIES["feasibility_write"],
            {
                "tenant_id": anfrage.tenant_id,
                "anfrage_id": anfrage.id,
                "ids": [p.id for p in positions],
                "feasible": [p.feasible for p in positions],
                "reasons": [p.reason for p in positions],
                "catalog_items": [p.catalog_item for p in positions],
                "catalog_materials": [p.catalog_material for p in positions],
            },
        )


def _calculate_compute(
    anfrage: _Inquiry, positions: list[_StagePosition]
) -> tuple[list[_StagePosition], Decimal, str]:
    catalog = _stage_catalog(anfrage)
    total = Decimal("0.00")
    for position in positions:
        if position.feasible is None:
            raise StageInputChanged(
                f"position {position.position_index} has no feasibility verdict; "
                "replay feasibility and the stages after it"
            )
        if not position.feasible:
            position.unit_price = position.total = None
            continue
        entry = catalog.entry(position.catalog_item)
        if entry is None:
            raise StageInputChanged(
                f"catalog item {position.catalog_item!r} of position "
                f"{position.position_index} is no longer in the catalog; "
                "replay feasibility and the stages after it"
            )
        price = price_position(
            entry, quantity=position.quantity, unit=position.unit, length_mm=position.length_mm
        )
        position.unit_price = price.unit_price
        position.total = price.total
        total += price.total
        if total > MAX_AMOUNT:
            # Refused here, not by the column: an overflow in the closing transaction is
            # "a database error", and retrying it changes nothing.
            raise QuoteTooLarge(
                f"the quote is too large: position {position.position_index} brings it past "
                f"{MAX_AMOUNT:,} {catalog.currency}; check the quantities"
            )
    return positions, total, catalog.currency


def _calculate_write(anfrage: _Inquiry, result: tuple[list[_StagePosition], Decimal, str]) -> None:
    positions, total, currency = result
    # The prices, and the inquiry complete with its quote: one statement.
    with sql.statement_cursor(connection) as cursor:
        cursor.execute(
            QUERIES["calculate_write"],
            {
                "tenant_id": anfrage.tenant_id,
                "anfrage_id": anfrage.id,
                "ids": [p.id for p in positions],
                "unit_prices": [p.unit_price for p in positions],
                "totals": [p.total for p in positions],
                "total": total,
                "currency": currency,
                "earlier": [s.value for s in Stage.CALCULATE.previous],
            },
        )


_STAGES: dict[Stage, _StageWork] = {
    Stage.INTAKE: _StageWork(_Reads.MANIFEST, _intake_prepare, _intake_compute, _intake_write),
    Stage.EXTRACT: _StageWork(_Reads.FILES, _extract_prepare, _extract_compute, _extract_write),
    Stage.FEASIBILITY: _StageWork(
        _Reads.POSITIONS, _positions_prepare, _feasibility_compute, _feasibility_write
    ),
    Stage.CALCULATE: _StageWork(
        _Reads.POSITIONS, _positions_prepare, _calculate_compute, _calculate_write
    ),
}


def _failure_text(exc: BaseException) -> str:
    """What the run's ``error`` shows the tenant: the pipeline's own refusals as they are;
    a database error only as such (its text names tables, columns and values, which stay
    in the log)."""
    if isinstance(exc, PipelineError):
        return f"{type(exc).__name__}: {exc.detail}"
    if isinstance(exc, DatabaseError):
        logger.error("stage failed on a database error", exc_info=exc)
        return "the results could not be written (a database error; the log has the details)"
    return f"{type(exc).__name__}: {exc}"


def _record_failure(claim: Claim, exc: BaseException) -> None:
    try:
        LEDGER.fail(claim, error=_failure_text(exc)[:MAX_ERROR_CHARS])
    except LeaseLost:
        logger.warning("run %s: lease lost before the failure could be recorded", claim.entry_id)


def pipeline_stage_run(*, anfrage_id: int, stage: Stage | str) -> StageOutcome:
    """Run one stage of an inquiry at most once to success.

    Must run outside ``transaction.atomic()`` (the claim commits on its own). The claim is
    one statement: an already successful stage is *skipped*; a stage another worker holds
    under a live lease raises ``PollLater``. Results, ``success`` and the next stage's job
    commit in one transaction; a worker whose lease was taken over commits nothing
    (``LEASE_LOST``). An error marks the run ``failed`` and propagates, to be retried.
    """
    stage = parse_stage(stage)
    work = _STAGES[stage]
    anfrage = _read_input(anfrage_id, stage, work)
    if anfrage is None:
        raise DoNotRetry(f"inquiry {anfrage_id} does not exist")
    # The stage before is observed in the statement that read the input (one snapshot):
    # its token, unchanged at the close, vouches that the input is still its output.
    prerequisite = _prerequisite(anfrage, stage)
    inputs, input_hash = work.prepare(anfrage)
    lease = lease_seconds()
    # The tenant's catalog (feasibility, calculate) is read right after the claim, in its
    # round trip: a statement after the claim's, so (under READ COMMITTED) on a snapshot
    # that sees what the claim saw (a replay that reopened the stage, the catalog it
    # changed before). On a busy or done claim it is read too, and not used.
    catalog = _CatalogRead(anfrage) if work.reads is _Reads.POSITIONS else None
    try:
        claim = LEDGER.claim(
            tenant=anfrage.tenant_id,
            anfrage=anfrage.id,
            stage=stage.value,
            input_hash=input_hash,
            lease_seconds=lease,
            also=catalog.send if catalog else None,
        )
        if claim.outcome is Outcome.DONE:
            if catalog:
                catalog.close()
            return StageOutcome.SKIPPED
        if claim.outcome is Outcome.BUSY:
            # Never skip: the holder may die; recovery then takes its job back, its lease
            # ends with it, and a poll takes over. A poll is no attempt.
            raise PollLater(f"{stage.value} of inquiry {anfrage.id} is running elsewhere")
    except LeaseLost as exc:
        # This run's job was taken back before it claimed (or its worker registered again
        # under a new id): a poll, never a success. Its save is fenced: the job's live run
        # does the stage; a job this worker holds again is put back and runs once more.
        if catalog:
            catalog.close()
        raise PollLater(f"{stage.value} of inquiry {anfrage.id}: {exc}") from exc
    except BaseException:
        if catalog:
            catalog.close()
        raise
    try:
        if catalog:
            anfrage = catalog.read()
        with LEDGER.renewing(claim, lease_seconds=lease) as renewal:
            result = work.compute(anfrage, inputs)
        if renewal.lost.is_set():
            raise LeaseLost(f"run {claim.entry_id}: taken over while {stage.value} computed")
        with transaction.atomic():
            # The stage before share-locked and checked, the results, and success with the
            # next stage's job and this job's own success (one statement): one round trip.
            try:
                LEDGER.complete(
                    claim,
                    hold=prerequisite,
                    write=lambda: work.write(anfrage, result),
                    then=_stage_job(anfrage=anfrage, stage=stage.next) if stage.next else None,
                    finish_job=True,
                )
            except PrerequisiteChanged as exc:
                raise _input_changed(stage, exc) from None
    except LeaseLost:
        logger.warning("%s of inquiry %s: lease lost, result discarded", stage, anfrage.id)
        return StageOutcome.LEASE_LOST
    except StageSuperseded as exc:
        # The stage before was reopened by a replay: this result is moot. The row stays
        # claimable and the replayed stage enqueues this one again when it succeeds.
        _record_failure(claim, exc)
        logger.info("%s of inquiry %s: %s", stage, anfrage.id, exc)
        return StageOutcome.SUPERSEDED
    except Exception as exc:
        _record_failure(claim, exc)
        if isinstance(exc, PipelineError) and not exc.retryable:
            raise DoNotRetry(str(exc)) from exc
        raise
    return StageOutcome.COMPLETED


def _read_input(anfrage_id: int, stage: Stage, work: _StageWork) -> _Inquiry | None:
    """The inquiry, the stage before's status and token and the stage's input, in one
    statement (``stage_input``)."""
    previous = stage.previous[-1].value if stage.previous else None
    with sql.statement_cursor(connection) as cursor:
        cursor.execute(_STAGE_INPUT[work.reads], {"anfrage_id": anfrage_id, "previous": previous})
        row = cursor.fetchone()
    if row is None:
        return None
    id_, tenant_id, slug, status, token, *read = row
    inquiry = _Inquiry(
        id=id_, tenant_id=tenant_id, tenant_slug=slug, previous_status=status, previous_token=token
    )
    if work.reads is _Reads.MANIFEST:
        return replace(inquiry, uploads=json.loads(read[0]))
    if work.reads is _Reads.FILES:
        return replace(inquiry, files=json.loads(read[0]))
    return replace(inquiry, positions=json.loads(read[0]))


class _CatalogRead:
    """The tenant's own catalog (``stage_catalog``), sent after the claim in its round
    trip (``LEDGER.claim(also=...)``) and read once the claim is back."""

    def __init__(self, anfrage: _Inquiry):
        self.anfrage = anfrage
        self.cursor: Any = None

    def send(self) -> None:
        self.close()  # sent again with a claim that is (a stale plan's retry)
        self.cursor = sql.statement_cursor(connection)
        self.cursor.execute(QUERIES["stage_catalog"], {"tenant_id": self.anfrage.tenant_id})

    def read(self) -> _Inquiry:
        with self.cursor:
            row = self.cursor.fetchone()
        return replace(self.anfrage, catalog=row[0] if row else None)

    def close(self) -> None:
        if self.cursor is not None:
            self.cursor.close()
            self.cursor = None


def _prerequisite(anfrage: _Inquiry, stage: Stage) -> Prerequisite | None:
    if not stage.previous:
        return None
    succeeded = anfrage.previous_status == LedgerStatus.SUCCESS
    return Prerequisite(
        key={"tenant": anfrage.tenant_id, "anfrage": anfrage.id, "stage": stage.previous[-1].value},
        token=anfrage.previous_token if succeeded else None,
    )


def _input_changed(stage: Stage, exc: PrerequisiteChanged) -> PipelineError:
    """What the closing transaction's first statement found, when the stage before is no
    longer ``success`` with the token it had when this stage read its input (in the
    statement, and so the snapshot, that read the input).

    The stage before's ledger row is read ``FOR SHARE`` (``LEDGER.complete(hold=...)``):
    a replay reopening it, or the stage before committing new output (its claim and
    ``complete`` update that row), waits for this transaction or is seen by it — never
    half of each. A reopened stage before supersedes this one; one that ran again (e.g.
    extract replayed and finished while this stage computed: its claim moved the token)
    means the input changed, and the stage is retried with the fresh input. A stage's
    input is written by the stage before, or by one further back that runs again only
    after a replay that reopened the stage before too, so its token says what re-reading
    and hashing the input would, without reading it.
    """
    previous = stage.previous[-1]
    if exc.status != LedgerStatus.SUCCESS:
        return StageSuperseded(
            f"stage {previous.value} was reopened by a replay; {stage.value} runs again after it"
        )
    return StageInputStale(
        f"the input of {stage.value} changed while it ran; it is retried with the new input"
    )
