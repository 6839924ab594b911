"""JSON API of runs (attached by config.api): analysis jobs and the runs users keep.

Thin views: validate the payload (pydantic, 422), call one service or selector, shape
the answer. Domain refusals (``runs.exceptions``) become 4xx JSON bodies in one place,
:func:`_client_error`; every call is scoped to the caller's user and tenant.

The payload's limits and the body limit agree: every payload within the limits below
fits ``DATA_UPLOAD_MAX_MEMORY_SIZE`` as UTF-8 JSON, and with every character outside
ASCII escaped as ``\\u`` plus four hex digits too, unless it lies beyond the Basic
Multilingual Plane (``tests/security/test_limits.py`` builds the largest).
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, Path, Query, Router, Schema, Status
from pydantic import ConfigDict, field_validator

from accounts.api import ClientError, ErrorOut, NotFound, StrictSchema
from accounts.pagination import PageQuery, page_response, paginate, sub_list_url
from runs import admission, durability, selectors
from runs.exceptions import (
    BudgetExhausted,
    CoreRefused,
    CoreUnavailable,
    HoldExpired,
    InsufficientCredits,
    JobNotFinished,
    JobNotFound,
    NoCitations,
    NothingToSave,
    ParentNotComplete,
    QueueFull,
    RunsError,
    TooManyCitations,
    UserInactive,
)
from runs.models import AnalysisJob, AnalysisRun, JobCitation, JobStatus, SavedBy, Verdict

router = Router(tags=["runs"])

#: Largest id PostgreSQL's bigint holds: anything above is a client error, not a 500.
MAX_ID = 2**63 - 1
MAX_TITLE_CHARS = 200
MAX_DOC_CHARS = 1_000_000
MAX_SOURCES = 50
MAX_SOURCE_KEY_CHARS = 64
MAX_SOURCE_TITLE_CHARS = 500
MAX_DOI_CHARS = 300
MAX_SOURCE_TEXT_CHARS = 20_000
SOURCE_KEY_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,{MAX_SOURCE_KEY_CHARS - 1}}}$"
#: ``Retry-After`` of a transient refusal (503).
TRANSIENT_RETRY_AFTER_SECONDS = 5
#: Verdicts on a job's own page; the rest through its verdicts list.
DETAIL_ITEMS = 100

_STATUS: dict[type[RunsError], int] = {
    InsufficientCredits: 402,
    UserInactive: 403,
    NoCitations: 422,
    ParentNotComplete: 409,
    JobNotFinished: 409,
    NothingToSave: 409,
    BudgetExhausted: 429,
    QueueFull: 429,
    TooManyCitations: 422,
    CoreRefused: 422,
    CoreUnavailable: 503,
    HoldExpired: 503,
}


def _client_error(exc: RunsError) -> ClientError:
    if isinstance(exc, JobNotFound):
        return NotFound()
    status = next((_STATUS[c] for c in type(exc).__mro__ if c in _STATUS), 400)
    headers = {}
    if status == 503:
        # Transient (the core is unreachable, a hold expired): try again shortly.
        headers["Retry-After"] = str(TRANSIENT_RETRY_AFTER_SECONDS)
    if isinstance(exc, BudgetExhausted):
        # The budget is a UTC day's: it refills at the next UTC midnight.
        now = timezone.now().astimezone(datetime.UTC)
        midnight = (now + datetime.timedelta(days=1)).replace(
            hour=0, minute=0, second=0, microsecond=0
        )
        headers["Retry-After"] = str(int((midnight - now).total_seconds()) + 1)
    return ClientError(str(exc), code=exc.code, status=status, headers=headers)


@contextmanager
def _refusals() -> Iterator[None]:
    try:
        yield
    except RunsError as exc:
        raise _client_error(exc) from exc


class SourceIn(StrictSchema):
    key: str = Field(pattern=SOURCE_KEY_PATTERN, description="How the document cites it.")
    title: str = Field("", max_length=MAX_SOURCE_TITLE_CHARS)
    doi: str | None = Field(None, max_length=MAX_DOI_CHARS)
    text: str = Field(
        "", max_length=MAX_SOURCE_TEXT_CHARS, description="The passage to check against."
    )


EXAMPLE_JOB_ID = 42
EXAMPLE_RUN_ID = "4b0c7a52-3f7e-4d7e-9a55-0e1c2b9a7f10"


class AnalysisJobIn(StrictSchema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "title": "Chapter 1",
                    "doc_html": "<p>Water boils at one hundred degrees at sea level [thermo].</p>",
                    "sources": [
                        {
                            "key": "thermo",
                            "title": "Thermodynamics",
                            "doi": "10.1000/thermo.1",
                            "text": "At sea level water boils at one hundred degrees.",
                        }
                    ],
                    "delta_of_job_id": None,
                }
            ]
        }
    )

    title: str = Field(min_length=1, max_length=MAX_TITLE_CHARS)
    doc_html: str = Field(
        min_length=1,
        max_length=MAX_DOC_CHARS,
        description='The document; cite a source as [KEY] or with data-source="KEY".',
    )
    sources: list[SourceIn] = Field(max_length=MAX_SOURCES)
    delta_of_job_id: int | None = Field(
        None,
        ge=1,
        le=MAX_ID,
        description="Re-check a complete analysis: the new job joins its run and skips the queue.",
    )

    @field_validator("sources")
    @classmethod
    def _unique_keys(cls, sources: list[SourceIn]) -> list[SourceIn]:
        # Markers match keys in any case ("[S1]" cites "s1"), so keys differing only in
        # case would be one key.
        keys = [s.key.casefold() for s in sources]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(
                f"source keys must be unique, in any case; repeated: {', '.join(duplicates)}"
            )
        return sources


class AdmissionOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": EXAMPLE_JOB_ID,
                    "run_id": EXAMPLE_RUN_ID,
                    "status": "queued",
                    "queue_position": 2,
                }
            ]
        }
    )

    id: int
    run_id: uuid.UUID
    status: Literal["pending", "queued"] = Field(
        description="pending: it starts now; queued: it waits behind the user's active job."
    )
    queue_position: int = Field(description="1 = next; 0 when not queued.")


class VerdictOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "marker": "c1",
                    "source_key": "thermo",
                    "claim": "Water boils at one hundred degrees at sea level.",
                    "verdict": "supported",
                    "score": 1.0,
                }
            ]
        }
    )

    marker: str
    source_key: str
    claim: str
    verdict: Verdict
    score: float


class AnalysisJobOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": EXAMPLE_JOB_ID,
                    "run_id": EXAMPLE_RUN_ID,
                    "status": "complete",
                    "queue_position": 0,
                    "title": "Chapter 1",
                    "delta_of_job_id": None,
                    "error": "",
                    "created_at": "2025-01-31T08:00:00Z",
                    "started_at": "2025-01-31T08:00:01Z",
                    "finished_at": "2025-01-31T08:00:03Z",
                    "summary": {
                        "citations": 1,
                        "supported": 1,
                        "partial": 0,
                        "unsupported": 0,
                        "missing_source": 0,
                    },
                    "verdicts": [
                        {
                            "marker": "c1",
                            "source_key": "thermo",
                            "claim": "Water boils at one hundred degrees at sea level.",
                            "verdict": "supported",
                            "score": 1.0,
                        }
                    ],
                    "verdicts_next": None,
                }
            ]
        }
    )

    id: int
    run_id: uuid.UUID
    status: JobStatus
    queue_position: int
    title: str
    delta_of_job_id: int | None
    error: str
    created_at: datetime.datetime
    started_at: datetime.datetime | None
    finished_at: datetime.datetime | None
    summary: dict[str, Any] | None = None
    verdicts: list[VerdictOut] | None = None
    verdicts_next: str | None = None


class RunSaveIn(StrictSchema):
    model_config = ConfigDict(json_schema_extra={"examples": [{"job_id": EXAMPLE_JOB_ID}]})

    job_id: int = Field(ge=1, le=MAX_ID, description="A complete (or failed) job of the caller.")


class RunOut(Schema):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "id": EXAMPLE_RUN_ID,
                    "job_id": EXAMPLE_JOB_ID,
                    "title": "Chapter 1",
                    "saved_by": "client",
                    "version": 1,
                    "created_at": "2025-01-31T08:00:04Z",
                    "updated_at": "2025-01-31T08:00:04Z",
                }
            ]
        }
    )

    id: uuid.UUID
    job_id: int | None
    title: str
    saved_by: SavedBy | None = Field(
        description="client: the browser saved it; worker: the backstop sweep did; "
        "null: a legacy row (counts as client)."
    )
    version: int
    created_at: datetime.datetime
    updated_at: datetime.datetime


def _job_out(job: AnalysisJob, *, position: int) -> dict[str, Any]:
    return {
        "id": job.pk,
        "run_id": job.run_id,
        "status": job.status,
        "queue_position": position,
        "title": job.title,
        "delta_of_job_id": job.delta_of_job_id,
        "error": job.error,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


def _verdict_out(c: JobCitation) -> dict[str, Any]:
    return {
        "marker": c.marker,
        "source_key": c.source_key,
        "claim": c.claim,
        "verdict": c.verdict,
        "score": c.score,
    }


#: Newest first; the id breaks ties of equal timestamps.
NEWEST_FIRST = ("-created_at", "-id")
VERDICT_ORDER = ("id",)


def _run_out(run: AnalysisRun) -> dict[str, Any]:
    return {
        "id": run.pk,
        "job_id": run.job_id,
        "title": run.title,
        "saved_by": run.saved_by,
        "version": run.version,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
    }


@router.post(
    "/analysis-jobs",
    response={201: AdmissionOut, 503: ErrorOut},
    summary="Admit an analysis (charged one credit; queued behind the user's active job)",
)
def admit_analysis_job(request, payload: AnalysisJobIn):
    """Admit an analysis: every check runs now (credits, sources, DOIs, the tenant's daily
    budget, the user's bound on open analyses); the job then waits its turn (`queued`,
    with its position) or starts (`pending`). 429 with `queue_full` or `budget_exhausted`
    when a bound is reached."""
    with _refusals():
        admitted = admission.analysis_job_admit(
            user=request.auth,
            title=payload.title,
            doc_html=payload.doc_html,
            sources=[s.model_dump() for s in payload.sources],
            delta_of_job_id=payload.delta_of_job_id,
        )
    return Status(
        201,
        {
            "id": admitted.id,
            "run_id": admitted.run_id,
            "status": admitted.status,
            "queue_position": admitted.queue_position,
        },
    )


@router.get(
    "/analysis-jobs",
    response=list[AnalysisJobOut],
    summary="The caller's analyses, newest first, with queue positions",
)
def list_analysis_jobs(request: HttpRequest, response: HttpResponse, query: Query[PageQuery]):
    """The caller's jobs, newest first, with their queue positions; the ``Link`` header
    names the next page."""
    jobs = page_response(
        request,
        response,
        selectors.analysis_jobs_of_user(user=request.auth),
        order=NEWEST_FIRST,
        query=query,
    )
    positions = selectors.queue_positions(jobs)
    return [_job_out(job, position=positions[job.pk]) for job in jobs]


@router.get(
    "/analysis-jobs/{job_id}",
    response=AnalysisJobOut,
    summary="One analysis: status, queue position, verdicts once complete",
)
def get_analysis_job(request: HttpRequest, job_id: int = Path(..., ge=1, le=MAX_ID)):
    """Status, queue position and, once complete, the summary and the first 100 verdicts
    (``verdicts_next`` names the list with the rest, null when there is none)."""
    with _refusals():
        job = selectors.analysis_job_for_user(user=request.auth, job_id=job_id)
    out = _job_out(job, position=selectors.queue_position(job))
    if job.status == JobStatus.COMPLETE:
        citations = selectors.job_citations(job_id=job.pk)
        page = paginate(citations, order=VERDICT_ORDER, cursor=None, limit=DETAIL_ITEMS)
        out["summary"] = (job.results or {}).get("summary")
        out["verdicts"] = [_verdict_out(c) for c in page.items]
        out["verdicts_next"] = sub_list_url(request, "verdicts", page)
    return out


@router.get(
    "/analysis-jobs/{job_id}/verdicts",
    response=list[VerdictOut],
    summary="One analysis's verdicts, in order (paged)",
)
def list_verdicts(
    request: HttpRequest,
    response: HttpResponse,
    query: Query[PageQuery],
    job_id: int = Path(..., ge=1, le=MAX_ID),
):
    """A job's verdicts in document order (empty until it is complete); the ``Link``
    header names the next page."""
    with _refusals():
        job = selectors.analysis_job_for_user(user=request.auth, job_id=job_id)
    citations = selectors.job_citations(job_id=job.pk)
    if job.status != JobStatus.COMPLETE:
        citations = citations.none()  # still pages it: a malformed cursor is a 400
    items = page_response(request, response, citations, order=VERDICT_ORDER, query=query)
    return [_verdict_out(c) for c in items]


@router.post(
    "/analysis-runs",
    response={200: RunOut, 201: RunOut},
    summary="Save a finished analysis as its run (the client save)",
)
def save_analysis_run(request, payload: RunSaveIn):
    """The client save: 201 when this call wrote the run, 200 when it was already saved."""
    with _refusals():
        saved = durability.analysis_run_save(user=request.auth, job_id=payload.job_id)
    return Status(201 if saved.written else 200, _run_out(saved.run))


@router.get(
    "/analysis-runs",
    response=list[RunOut],
    summary="The caller's runs, newest first",
)
def list_analysis_runs(request: HttpRequest, response: HttpResponse, query: Query[PageQuery]):
    """The caller's runs, newest first (the side panel); the ``Link`` header names the
    next page."""
    runs = selectors.analysis_runs_of_user(user=request.auth)
    items = page_response(request, response, runs, order=NEWEST_FIRST, query=query)
    return [_run_out(run) for run in items]
