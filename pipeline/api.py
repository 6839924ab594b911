"""JSON API of the pipeline (attached by config.api): submit an inquiry, read its status.

Every call is scoped to the caller's tenant; another tenant's inquiry is a 404. Pipeline
errors become ``{"error": code, "detail": ...}`` with their status, here in one place.

The upload is read by :class:`pipeline.uploads.StagingUploadHandler`, installed on that
one operation before anything reads its body: the tenant's hourly bound is checked
before the body is read at all, and the files stream to disk, hashed, refused as soon as
they break a limit.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from decimal import Decimal
from functools import wraps
from typing import Literal

from django.http import HttpRequest, HttpResponse
from ninja import Field, Path, Query, Router, Schema, Status
from ninja.decorators import decorate_view
from pydantic import ConfigDict

from accounts.api import ClientError
from accounts.pagination import PageQuery, page_response, paginate, sub_list_url
from pipeline.exceptions import (
    PipelineError,
    TooManyInquiries,
    UnexpectedField,
    UnsupportedMediaType,
)
from pipeline.limits import MAX_FILE_BYTES, MAX_FILES, MAX_TITLE
from pipeline.models import Anfrage, ExtractionWarning, FileFormat, Position, Stage, Unit
from pipeline.selectors import anfrage_detail, anfrage_get, anfrage_overview
from pipeline.submit import anfrage_submit_allowed, anfrage_submit_staged
from pipeline.uploads import StagingUploadHandler, StreamedUpload

router = Router(tags=["pipeline"])

#: Largest id PostgreSQL's bigint holds: anything above is a client error, not a 500.
MAX_ID = 2**63 - 1
#: Positions and warnings on an inquiry's own page; the rest through their lists.
DETAIL_ITEMS = 100
UPLOAD_FIELDS = {"title", "csrfmiddlewaretoken"}
MULTIPART = "multipart/form-data"


@contextmanager
def _client_errors() -> Iterator[None]:
    try:
        yield
    except PipelineError as exc:
        headers = {}
        if isinstance(exc, TooManyInquiries):
            headers["Retry-After"] = str(exc.retry_after)
        raise ClientError(exc.detail, code=exc.code, status=exc.status, headers=headers) from exc


#: A stage's status: the ledger's, or ``pending`` before the stage first ran.
StageStatusValue = Literal["pending", "running", "success", "failed"]
EXAMPLE_STAGES = [
    {
        "stage": stage,
        "status": "success",
        "waiting": False,
        "attempts": 1,
        "error": "",
        "started_at": "2025-01-31T08:00:00Z",
        "finished_at": "2025-01-31T08:00:01Z",
    }
    for stage in ("intake", "extract", "feasibility", "calculate")
]
EXAMPLE_POSITION = {
    "index": 1,
    "label": "1",
    "source_file_id": 3,
    "source_line": 1,
    "quantity": "12.000",
    "unit": "pcs",
    "item": "steel beam HEA 200",
    "material": "steel",
    "catalog_item": "beam",
    "catalog_material": "S235",
    "material_assumed": False,
    "material_shown": "S235 (steel)",
    "length_mm": 6000,
    "feasible": True,
    "reason": "",
    "unit_price": "216.00",
    "total": "2592.00",
}


class AnfrageCreated(Schema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"id": 7}]})

    id: int


class StageOut(Schema):
    stage: Stage
    status: StageStatusValue = Field(description="pending: the stage has not run yet.")
    waiting: bool = Field(
        description="A replay reset or queued the stage and it has not run since (its "
        "status stays failed until a worker claims it): it waits, it has not failed."
    )
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
    model_config = ConfigDict(json_schema_extra={"examples": [EXAMPLE_POSITION]})

    index: int
    label: str
    source_file_id: int | None
    source_line: int
    quantity: Decimal
    unit: Unit
    item: str
    material: str = Field(description="The material as the inquiry names it (may be empty).")
    catalog_item: str
    catalog_material: str = Field(
        description="The catalog's material the position is checked and priced in."
    )
    material_assumed: bool = Field(
        description="True when the inquiry named no material and feasibility assumed "
        "catalog_material."
    )
    material_shown: str = Field(
        description="The material as every view shows it: catalog_material, marked "
        "'(assumed)' or followed by the inquiry's word; before feasibility, material."
    )
    length_mm: int | None
    feasible: bool | None
    reason: str
    unit_price: Decimal | None
    total: Decimal | None


class WarningOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "source_file_id": 3,
                    "line_no": 4,
                    "line": "see attached drawing",
                    "message": "no quantity found",
                }
            ]
        }
    )

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
                    "positions": [EXAMPLE_POSITION],
                    "positions_next": None,
                    "warnings": [],
                    "warnings_next": None,
                    "quote_total": "2592.00",
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
    positions_next: str | None
    warnings: list[WarningOut]
    warnings_next: str | None
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
                    "quote_total": "2592.00",
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


def _stream_uploads(run: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Install the streaming upload handler before authentication or anything else can
    read the body (a session's CSRF check reads the form)."""

    @wraps(run)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        request.upload_handlers = [StagingUploadHandler(request)]
        return run(request, *args, **kwargs)

    return wrapper


UPLOAD_BODY = {
    "required": True,
    "content": {
        MULTIPART: {
            "schema": {
                "type": "object",
                "required": ["files"],
                "properties": {
                    "title": {"type": "string", "maxLength": MAX_TITLE},
                    "files": {
                        "type": "array",
                        "minItems": 1,
                        "maxItems": MAX_FILES,
                        "items": {"type": "string", "format": "binary"},
                        "description": f"at most {MAX_FILES} files of {MAX_FILE_BYTES:,} bytes",
                    },
                },
            }
        }
    },
}


@router.post(
    "/anfragen",
    response={201: AnfrageCreated},
    summary="Submit an inquiry (multipart: one or more 'files', optional 'title')",
    openapi_extra={"requestBody": UPLOAD_BODY},
)
@decorate_view(_stream_uploads)
def anfrage_create(request: HttpRequest):
    """Files: plain text (``12 pcs steel beam HEA 200, 6 m`` per line), CSV
    (``position;qty;unit;item;material;length_mm``) or Markdown lists, at most 5 MiB each,
    at most 20. Returns at once; the pipeline runs in the background (poll
    ``GET /anfragen/{id}``): a file that turns out unreadable fails its inquiry's intake
    or extract stage with the reason. 429 once the tenant reached its inquiries per hour."""
    with _client_errors():
        anfrage_submit_allowed(tenant=request.auth.tenant)
        if (request.content_type or "").lower() != MULTIPART:
            raise UnsupportedMediaType(
                f"send the inquiry as {MULTIPART} (got {request.content_type or 'nothing'})"
            )
        unexpected = sorted((set(request.POST) - UPLOAD_FIELDS) | (set(request.FILES) - {"files"}))
        if unexpected:
            raise UnexpectedField(
                f"unexpected field(s) {', '.join(map(repr, unexpected))}; send 'files' and "
                "optionally 'title'"
            )
        files = [f.staged for f in request.FILES.getlist("files") if isinstance(f, StreamedUpload)]
        anfrage = anfrage_submit_staged(
            tenant=request.auth.tenant,
            files=files,
            title=request.POST.get("title", ""),
            actor=_actor(request),
        )
    return Status(201, {"id": anfrage.id})


@router.get(
    "/anfragen",
    response=list[AnfrageSummaryOut],
    summary="The tenant's inquiries, newest first, with their stage statuses",
)
def anfrage_list(request: HttpRequest, response: HttpResponse, query: Query[PageQuery]):
    """Only the caller's tenant's inquiries; ``complete`` once all four stages succeeded.
    The ``Link`` header names the next page."""
    anfragen = page_response(
        request,
        response,
        Anfrage.objects.filter(tenant_id=request.auth.tenant_id),
        order=("-id",),
        query=query,
    )
    return [
        {
            "id": anfrage.id,
            "title": anfrage.title,
            "created_at": anfrage.created_at,
            "complete": all(s.status == "success" for s in stages),
            "stages": [{**asdict(s), "waiting": s.waiting} for s in stages],
            "quote_total": anfrage.quote_total,
            "currency": anfrage.currency,
        }
        for anfrage, stages in anfrage_overview(anfragen=anfragen)
    ]


def _position_out(p: Position) -> dict:
    return {
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
        "material_assumed": p.material_assumed,
        "material_shown": p.material_shown,
        "length_mm": p.length_mm,
        "feasible": p.feasible,
        "reason": p.reason,
        "unit_price": p.unit_price,
        "total": p.total,
    }


def _warning_out(w: ExtractionWarning) -> dict:
    return {
        "source_file_id": w.source_file_id,
        "line_no": w.line_no,
        "line": w.line,
        "message": w.message,
    }


POSITION_ORDER = ("position_index",)
WARNING_ORDER = ("id",)


def _positions(anfrage: Anfrage):
    return Position.objects.filter(tenant_id=anfrage.tenant_id, anfrage_id=anfrage.id)


def _warnings(anfrage: Anfrage):
    return ExtractionWarning.objects.filter(tenant_id=anfrage.tenant_id, anfrage_id=anfrage.id)


def _tenant_anfrage(request: HttpRequest, anfrage_id: int) -> Anfrage:
    with _client_errors():
        return anfrage_get(tenant_id=request.auth.tenant_id, anfrage_id=anfrage_id)


@router.get(
    "/anfragen/{anfrage_id}",
    response=AnfrageOut,
    summary="An inquiry: stage statuses, files, positions and the quote",
)
def anfrage_read(request: HttpRequest, anfrage_id: int = Path(..., ge=1, le=MAX_ID)):
    """Each stage's status, attempts and error; the first 100 positions with feasibility
    and prices and the first 100 warnings (``positions_next`` and ``warnings_next`` name
    the lists with the rest, null when there is none); the quote total once
    ``calculate`` succeeded."""
    anfrage = _tenant_anfrage(request, anfrage_id)
    detail = anfrage_detail(anfrage=anfrage, rows=False)
    positions = paginate(_positions(anfrage), order=POSITION_ORDER, cursor=None, limit=DETAIL_ITEMS)
    warnings = paginate(_warnings(anfrage), order=WARNING_ORDER, cursor=None, limit=DETAIL_ITEMS)
    return {
        "id": anfrage.id,
        "title": anfrage.title,
        "created_at": anfrage.created_at,
        "complete": detail.complete,
        "stages": [{**asdict(s), "waiting": s.waiting} for s in detail.stages],
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
        "positions": [_position_out(p) for p in positions.items],
        "positions_next": sub_list_url(request, "positions", positions),
        "warnings": [_warning_out(w) for w in warnings.items],
        "warnings_next": sub_list_url(request, "warnings", warnings),
        "quote_total": detail.quote_total,
        "currency": detail.currency,
    }


@router.get(
    "/anfragen/{anfrage_id}/positions",
    response=list[PositionOut],
    summary="An inquiry's positions, in order",
)
def anfrage_positions(
    request: HttpRequest,
    response: HttpResponse,
    query: Query[PageQuery],
    anfrage_id: int = Path(..., ge=1, le=MAX_ID),
):
    """The positions by index; the ``Link`` header names the next page."""
    positions = _positions(_tenant_anfrage(request, anfrage_id))
    items = page_response(request, response, positions, order=POSITION_ORDER, query=query)
    return [_position_out(p) for p in items]


@router.get(
    "/anfragen/{anfrage_id}/warnings",
    response=list[WarningOut],
    summary="The lines of an inquiry's files that could not be read",
)
def anfrage_warnings(
    request: HttpRequest,
    response: HttpResponse,
    query: Query[PageQuery],
    anfrage_id: int = Path(..., ge=1, le=MAX_ID),
):
    """In file order; the ``Link`` header names the next page."""
    warnings = _warnings(_tenant_anfrage(request, anfrage_id))
    items = page_response(request, response, warnings, order=WARNING_ORDER, query=query)
    return [_warning_out(w) for w in items]
