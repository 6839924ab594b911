"""JSON API of the pipeline (attached by config.api): submit an inquiry, read its status.

Every call is scoped to the caller's tenant; another tenant's inquiry is a 404. Pipeline
errors become ``{"error": code, "detail": ...}`` with their status, here in one place.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from decimal import Decimal
from typing import Literal

from django.http import HttpRequest
from ninja import Field, File, Form, Query, Router, Schema, Status
from ninja.files import UploadedFile
from pydantic import ConfigDict

from accounts.api import ClientError
from pipeline.exceptions import FileTooLarge, PipelineError
from pipeline.models import FileFormat, Stage, Unit
from pipeline.selectors import anfrage_detail, anfrage_get, anfrage_overview
from pipeline.services import MAX_FILE_BYTES, Upload, anfrage_submit

router = Router(tags=["pipeline"])


@contextmanager
def _client_errors() -> Iterator[None]:
    try:
        yield
    except PipelineError as exc:
        raise ClientError(exc.detail, code=exc.code, status=exc.status) from exc


#: A stage's status: the ledger's, or ``pending`` before the stage first ran.
StageStatusValue = Literal["pending", "running", "success", "failed"]
EXAMPLE_STAGES = [
    {
        "stage": stage,
        "status": "success",
        "attempts": 1,
        "error": "",
        "started_at": "2025-01-31T08:00:00Z",
        "finished_at": "2025-01-31T08:00:01Z",
    }
    for stage in ("intake", "extract", "feasibility", "calculate")
]


class AnfrageCreated(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 7}]})

    id: int


class StageOut(Schema):
    stage: Stage
    status: StageStatusValue = Field(description="pending: the stage has not run yet.")
    attempts: int
    error: str
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None


class FileOut(Schema):
    id: int
    filename: str
    format: FileFormat
    size: int
    sha256: str


class PositionOut(Schema):
    index: int
    label: str
    source_file_id: int | None
    source_line: int
    quantity: Decimal
    unit: Unit
    item: str
    material: str
    catalog_item: str
    catalog_material: str
    length_mm: int | None
    feasible: bool | None
    reason: str
    unit_price: Decimal | None
    total: Decimal | None


class WarningOut(Schema):
    source_file_id: int | None
    line_no: int
    line: str
    message: str


class AnfrageOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 7,
                    "title": "Steel beams for hall 3",
                    "created_at": "2025-01-31T08:00:00Z",
                    "complete": True,
                    "stages": EXAMPLE_STAGES,
                    "files": [
                        {
                            "id": 3,
                            "filename": "steel-beams.txt",
                            "format": "text",
                            "size": 99,
                            "sha256": "9f2c…",
                        }
                    ],
                    "positions": [
                        {
                            "index": 1,
                            "label": "1",
                            "source_file_id": 3,
                            "source_line": 1,
                            "quantity": "12.000",
                            "unit": "pcs",
                            "item": "steel beam HEA 200",
                            "material": "steel",
                            "catalog_item": "beam",
                            "catalog_material": "steel",
                            "length_mm": 6000,
                            "feasible": True,
                            "reason": "",
                            "unit_price": "237.00",
                            "total": "2844.00",
                        }
                    ],
                    "warnings": [],
                    "quote_total": "2844.00",
                    "currency": "EUR",
                }
            ]
        }
    )

    id: int
    title: str
    created_at: datetime.datetime
    complete: bool
    stages: list[StageOut]
    files: list[FileOut]
    positions: list[PositionOut]
    warnings: list[WarningOut]
    quote_total: Decimal | None
    currency: str


class AnfrageSummaryOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": 7,
                    "title": "Steel beams for hall 3",
                    "created_at": "2025-01-31T08:00:00Z",
                    "complete": True,
                    "stages": EXAMPLE_STAGES,
                    "quote_total": "2844.00",
                    "currency": "EUR",
                }
            ]
        }
    )

    id: int
    title: str
    created_at: datetime.datetime
    complete: bool
    stages: list[StageOut]
    quote_total: Decimal | None
    currency: str


def _actor(request: HttpRequest) -> str:
    return f"user:{request.auth.username}"


@router.post(
    "/anfragen",
    response={201: AnfrageCreated},
    summary="Submit an inquiry (multipart: one or more 'files', optional 'title')",
)
def anfrage_create(
    request: HttpRequest,
    title: Form[str] = "",
    files: File[list[UploadedFile]] = None,
):
    """Files: plain text (``12 pcs steel beam HEA 200, 6 m`` per line), CSV
    (``position;qty;unit;item;material;length_mm``) or Markdown lists, at most 5 MiB each.
    Returns at once; the pipeline runs in the background (poll ``GET /anfragen/{id}``)."""
    with _client_errors():
        uploads = []
        for upload in files or ():
            # Checked before reading: an oversized file is never read into memory.
            if upload.size > MAX_FILE_BYTES:
                raise FileTooLarge(
                    f"file {upload.name!r} has {upload.size} bytes; at most {MAX_FILE_BYTES}"
                )
            uploads.append(Upload(filename=upload.name or "", data=upload.read()))
        anfrage = anfrage_submit(
            tenant=request.auth.tenant, uploads=uploads, title=title, actor=_actor(request)
        )
    return Status(201, {"id": anfrage.id})


@router.get(
    "/anfragen",
    response=list[AnfrageSummaryOut],
    summary="The tenant's inquiries, newest first, with their stage statuses",
)
def anfrage_list(request: HttpRequest, limit: int = Query(50, ge=1, le=200)):
    """Only the caller's tenant's inquiries; ``complete`` once all four stages succeeded."""
    return [
        {
            "id": anfrage.id,
            "title": anfrage.title,
            "created_at": anfrage.created_at,
            "complete": all(s.status == "success" for s in stages),
            "stages": [asdict(s) for s in stages],
            "quote_total": anfrage.quote_total,
            "currency": anfrage.currency,
        }
        for anfrage, stages in anfrage_overview(tenant_id=request.auth.tenant_id, limit=limit)
    ]


@router.get(
    "/anfragen/{anfrage_id}",
    response=AnfrageOut,
    summary="An inquiry: stage statuses, files, positions and the quote",
)
def anfrage_read(request: HttpRequest, anfrage_id: int):
    """Each stage's status, attempts and error; the positions with feasibility and prices;
    the quote total once ``calculate`` succeeded."""
    with _client_errors():
        anfrage = anfrage_get(tenant_id=request.auth.tenant_id, anfrage_id=anfrage_id)
    detail = anfrage_detail(anfrage=anfrage)
    return {
        "id": anfrage.id,
        "title": anfrage.title,
        "created_at": anfrage.created_at,
        "complete": detail.complete,
        "stages": [asdict(s) for s in detail.stages],
        "files": [
            {
                "id": f.id,
                "filename": f.filename,
                "format": f.format,
                "size": f.size,
                "sha256": f.sha256,
            }
            for f in detail.files
        ],
        "positions": [
            {
                "index": p.position_index,
                "label": p.label,
                "source_file_id": p.source_file_id,
                "source_line": p.source_line,
                "quantity": p.quantity,
                "unit": p.unit,
                "item": p.item,
                "material": p.material,
                "catalog_item": p.catalog_item,
                "catalog_material": p.catalog_material,
                "length_mm": p.length_mm,
                "feasible": p.feasible,
                "reason": p.reason,
                "unit_price": p.unit_price,
                "total": p.total,
            }
            for p in detail.positions
        ],
        "warnings": [
            {
                "source_file_id": w.source_file_id,
                "line_no": w.line_no,
                "line": w.line,
                "message": w.message,
            }
            for w in detail.warnings
        ],
        "quote_total": anfrage.quote_total,
        "currency": anfrage.currency,
    }
