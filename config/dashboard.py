"""The user's dashboard: their analyses (running and queued, with positions), their runs
side panel, their tenant's inquiries as a stage board, forms to submit an analysis and to
upload an inquiry; and a detail page per inquiry (stages with times and errors,
positions, quote, its files to download) and per analysis (status, verdicts, the
document, its run). Every page says when no worker is alive (``queueing.health``), since
queued work then waits for ever.

Server-rendered, so every page works without JavaScript. Every read goes through the
domains' selectors, scoped to the logged-in user and their tenant: another tenant's id is
a 404. ``static/pgstage/dashboard.js`` then keeps the pages current by polling the JSON
API with capped backoff (no reload), submits the forms through the API, and — being the
browser the design speaks of — saves a finished analysis through ``POST
/api/analysis-runs`` when it sees it terminal, only for the newest job of its run: the
fast path the backstop sweep only covers for.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.utils.http import content_disposition_header
from django.views.decorators.http import require_POST, require_safe

from accounts.models import User
from config.metrics import record_admission_rejection
from pipeline import selectors as pipeline_selectors
from pipeline.exceptions import AnfrageNotFound, FileTooLarge, PipelineError, StorageCorrupt
from pipeline.limits import MAX_FILE_BYTES
from pipeline.models import Anfrage, FileFormat
from pipeline.selectors import StageStatus
from pipeline.storage import read_stored
from pipeline.submit import Upload, anfrage_submit
from queueing.health import worker_liveness
from runs import admission as runs_admission
from runs import selectors as runs_selectors
from runs.api import MAX_DOC_CHARS, MAX_SOURCE_TEXT_CHARS, SOURCE_KEY_PATTERN
from runs.exceptions import InsufficientCredits, JobNotFound, RunsError
from runs.models import (
    ACTIVE_STATUSES,
    RECORDABLE_STATUSES,
    TERMINAL_STATUSES,
    AnalysisJob,
    AnalysisRun,
    JobStatus,
)

logger = logging.getLogger(__name__)

LOGIN_URL = "login"
LIVE_STATUSES = (JobStatus.RUNNING, JobStatus.PENDING, JobStatus.QUEUED)
#: Enough to hold a busy user's whole queue; older finished jobs fall off the page.
JOB_LIMIT = 100
RECENT_LIMIT = 10
RUN_LIMIT = 20
ANFRAGE_LIMIT = 20
#: The analysis page shows the document's HTML source up to this many characters (the
#: API admits a million).
DOC_SHOWN_CHARS = 100_000
#: What a downloaded file is sent as, by the format intake recognised.
FILE_TYPES = {
    FileFormat.TEXT: "text/plain",
    FileFormat.CSV: "text/csv",
    FileFormat.MARKDOWN: "text/markdown",
}


class AnalysisForm(forms.Form):
    """One document and one source: the dashboard's short form of POST /api/analysis-jobs."""

    title = forms.CharField(max_length=200)
    doc_html = forms.CharField(
        label="Document (HTML)",
        max_length=MAX_DOC_CHARS,
        widget=forms.Textarea(attrs={"rows": 4}),
        help_text='Cite the source as [KEY] or with data-source="KEY".',
    )
    source_key = forms.RegexField(regex=SOURCE_KEY_PATTERN, max_length=64, label="Source key")
    source_title = forms.CharField(max_length=500, required=False, label="Source title")
    source_doi = forms.CharField(max_length=300, required=False, label="DOI")
    source_text = forms.CharField(
        max_length=MAX_SOURCE_TEXT_CHARS,
        required=False,
        label="Source text",
        widget=forms.Textarea(attrs={"rows": 3}),
    )

    def source(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "key": data["source_key"],
            "title": data["source_title"],
            "doi": data["source_doi"] or None,
            "text": data["source_text"],
        }


@dataclass(frozen=True, kw_only=True)
class JobRow:
    job: AnalysisJob
    position: int
    unsaved: bool


@dataclass(frozen=True, kw_only=True)
class InquiryRow:
    anfrage: Anfrage
    stages: tuple[StageStatus, ...]

    @property
    def in_flight(self) -> bool:
        statuses = {s.shown for s in self.stages}
        if "running" in statuses:
            return True
        return "failed" not in statuses and statuses != {"success"}


class InquiryForm(forms.Form):
    """The dashboard's short form of ``POST /api/anfragen`` (the files are read from
    ``request.FILES`` under the same field name, ``files``)."""

    title = forms.CharField(max_length=200, required=False)


def _job_sort_key(row: JobRow) -> tuple[int, int, int]:
    return (LIVE_STATUSES.index(row.job.status), row.position, row.job.pk)


def dashboard_context(user: User) -> dict[str, Any]:
    """Everything the page shows, read for ``user`` and their tenant only."""
    jobs = runs_selectors.analysis_jobs_for_user(user=user, limit=JOB_LIMIT)
    positions = runs_selectors.queue_positions(jobs)
    live = [j for j in jobs if j.status in LIVE_STATUSES]
    recent = [j for j in jobs if j.status not in LIVE_STATUSES][:RECENT_LIMIT]
    finished = [j for j in recent if j.status in RECORDABLE_STATUSES]
    saved = runs_selectors.saved_job_ids(user=user, jobs=finished)
    # Only the newest job of a run is saved by the page: an older one would be stale.
    newest = runs_selectors.newest_job_ids(user=user, run_ids=[j.run_id for j in finished])
    live_rows = sorted(
        (JobRow(job=j, position=positions[j.pk], unsaved=False) for j in live),
        key=_job_sort_key,
    )
    recent_rows = [
        JobRow(
            job=j,
            position=0,
            unsaved=(
                j.status in RECORDABLE_STATUSES
                and j.results is not None
                and j.pk in newest
                and j.pk not in saved
            ),
        )
        for j in recent
    ]
    inquiries = [
        InquiryRow(anfrage=a, stages=stages)
        for a, stages in pipeline_selectors.anfrage_overview(
            tenant_id=user.tenant_id, limit=ANFRAGE_LIMIT
        )
    ]
    return {
        "balance": runs_selectors.credit_balance(user_id=user.pk),
        "running": [r for r in live_rows if r.job.status in ACTIVE_STATUSES],
        "queued": [r for r in live_rows if r.job.status == JobStatus.QUEUED],
        "recent": recent_rows,
        "runs": list(runs_selectors.analysis_runs_for_user(user=user, limit=RUN_LIMIT)),
        "inquiries": inquiries,
        "in_flight": bool(live) or any(row.in_flight for row in inquiries),
        "workers": worker_liveness(),
    }


def _render(
    request: HttpRequest,
    form: AnalysisForm | None = None,
    *,
    inquiry_form: InquiryForm | None = None,
    status: int = 200,
) -> HttpResponse:
    user = request.user
    if user.tenant_id is None:
        return render(request, "dashboard/no_tenant.html", status=403)
    context = dashboard_context(user) | {
        "form": form or AnalysisForm(),
        "inquiry_form": inquiry_form or InquiryForm(),
    }
    return render(request, "dashboard/index.html", context, status=status)


@require_safe
@login_required(login_url=LOGIN_URL)
def dashboard_view(request: HttpRequest) -> HttpResponse:
    return _render(request)


@require_POST
@login_required(login_url=LOGIN_URL)
def analysis_submit_view(request: HttpRequest) -> HttpResponse:
    """Admit an analysis through the same service as the API: on success redirect back
    (post/redirect/get); on bad input or a refusal re-render the form with the reason
    and a 4xx status, having written nothing."""
    form = AnalysisForm(request.POST)
    if request.user.tenant_id is None:
        return _render(request, form, status=403)
    if not form.is_valid():
        record_admission_rejection("invalid_payload")
        return _render(request, form, status=400)
    try:
        admission = runs_admission.analysis_job_admit(
            user=request.user,
            title=form.cleaned_data["title"],
            doc_html=form.cleaned_data["doc_html"],
            sources=[form.source()],
        )
    except RunsError as exc:
        record_admission_rejection(exc.code)
        form.add_error(None, str(exc))
        return _render(request, form, status=402 if isinstance(exc, InsufficientCredits) else 400)
    where = (
        f"queued at position {admission.queue_position}"
        if admission.status == JobStatus.QUEUED
        else "starting now"
    )
    # The tag lets the page's script remove the message once the analysis has finished.
    messages.success(
        request, f"Analysis #{admission.id} admitted, {where}.", extra_tags=f"job:{admission.id}"
    )
    return redirect("dashboard")


@require_POST
@login_required(login_url=LOGIN_URL)
def inquiry_submit_view(request: HttpRequest) -> HttpResponse:
    """Submit an inquiry through the same service as ``POST /api/anfragen``; on success go
    to its detail page, on bad input re-render the dashboard with the reason and a 4xx
    status, having written nothing."""
    form = InquiryForm(request.POST)
    if request.user.tenant_id is None:
        return _render(request, inquiry_form=form, status=403)
    if not form.is_valid():
        return _render(request, inquiry_form=form, status=400)
    try:
        uploads = []
        for upload in request.FILES.getlist("files"):
            if upload.size > MAX_FILE_BYTES:  # refused before it is read
                raise FileTooLarge(
                    f"file {upload.name!r} has {upload.size} bytes; at most {MAX_FILE_BYTES}"
                )
            uploads.append(Upload(filename=upload.name or "", data=upload.read()))
        anfrage = anfrage_submit(
            tenant=request.user.tenant,
            uploads=uploads,
            title=form.cleaned_data["title"],
            actor=f"user:{request.user.username}",
        )
    except PipelineError as exc:
        form.add_error(None, str(exc.detail))
        status = exc.status if 400 <= exc.status < 500 else 400
        return _render(request, inquiry_form=form, status=status)
    messages.success(
        request,
        f"Inquiry #{anfrage.id} submitted; its pipeline is running.",
        extra_tags=f"anfrage:{anfrage.id}",
    )
    return redirect("inquiry-detail", anfrage_id=anfrage.id)


@dataclass(frozen=True, kw_only=True)
class StageRow:
    status: StageStatus

    @property
    def seconds(self) -> float | None:
        started, finished = self.status.started_at, self.status.finished_at
        if started is None or finished is None:
            return None
        return (finished - started).total_seconds()


@require_safe
@login_required(login_url=LOGIN_URL)
def inquiry_detail_view(request: HttpRequest, anfrage_id: int) -> HttpResponse:
    """One inquiry of the user's tenant: stages with times, attempts and errors; files;
    positions with feasibility and prices; the quote."""
    if request.user.tenant_id is None:
        return render(request, "dashboard/no_tenant.html", status=403)
    try:
        anfrage = pipeline_selectors.anfrage_get(
            tenant_id=request.user.tenant_id, anfrage_id=anfrage_id
        )
    except AnfrageNotFound:
        raise Http404("no such inquiry") from None
    detail = pipeline_selectors.anfrage_detail(anfrage=anfrage)
    row = InquiryRow(anfrage=anfrage, stages=detail.stages)
    return render(
        request,
        "dashboard/inquiry.html",
        {
            "anfrage": anfrage,
            "detail": detail,
            "stages": [StageRow(status=s) for s in detail.stages],
            "in_flight": row.in_flight,
            "workers": worker_liveness(),
        },
    )


@require_safe
@login_required(login_url=LOGIN_URL)
def inquiry_file_view(request: HttpRequest, anfrage_id: int, file_id: int) -> HttpResponse:
    """A stored file of an inquiry of the user's tenant, as an attachment under the name it
    was uploaded with; another tenant's inquiry or file is a 404. A stored copy that is
    missing on disk or no longer matches its SHA-256 is a 404 page saying so (never its
    bytes), logged as an error for the operators: the upload is lost, not the request
    wrong."""
    if request.user.tenant_id is None:
        raise Http404("no such file")
    try:
        stored = pipeline_selectors.anfrage_file_get(
            tenant_id=request.user.tenant_id, anfrage_id=anfrage_id, file_id=file_id
        )
    except AnfrageNotFound:
        raise Http404("no such file") from None
    try:
        data = read_stored(key=stored.storage_key, sha256=stored.sha256)
    except StorageCorrupt as exc:
        logger.error("inquiry %s file %s cannot be served: %s", anfrage_id, file_id, exc)
        return render(request, "dashboard/file_missing.html", {"stored": stored}, status=404)
    response = HttpResponse(
        data, content_type=FILE_TYPES.get(stored.format, "application/octet-stream")
    )
    response["Content-Disposition"] = content_disposition_header(True, stored.filename)
    return response


@require_safe
@login_required(login_url=LOGIN_URL)
def workers_view(request: HttpRequest) -> JsonResponse:
    """Whether any worker is alive, for the pages' notice: ``alive``, the newest heartbeat
    and the threshold it is judged by. Up or down only, as ``/readyz`` tells anyone."""
    liveness = worker_liveness()
    return JsonResponse(
        {
            "alive": liveness.alive,
            "last_heartbeat": liveness.last_heartbeat,
            "threshold_seconds": liveness.threshold.total_seconds(),
        }
    )


@require_safe
@login_required(login_url=LOGIN_URL)
def analysis_detail_view(request: HttpRequest, job_id: int) -> HttpResponse:
    """One of the user's analyses: status, queue position, times, verdicts, and whether
    its run holds it (the page saves it when it is the newest job of its run)."""
    user = request.user
    if user.tenant_id is None:
        return render(request, "dashboard/no_tenant.html", status=403)
    try:
        job = runs_selectors.analysis_job_for_user(user=user, job_id=job_id)
    except JobNotFound:
        raise Http404("no such analysis") from None
    # The run's newest job: the one whose result the run keeps, where its id links to.
    run_job_id = max(runs_selectors.newest_job_ids(user=user, run_ids=[job.run_id]), default=job.pk)
    newest = job.pk == run_job_id
    saved = job.pk in runs_selectors.saved_job_ids(user=user, jobs=[job])
    run = AnalysisRun.objects.defer("doc_html").filter(pk=job.run_id, user_id=user.pk).first()
    document = job.doc_html or ""
    return render(
        request,
        "dashboard/analysis.html",
        {
            "job": job,
            "position": runs_selectors.queue_position(job),
            "citations": runs_selectors.job_citations(job_id=job.pk),
            "summary": (job.results or {}).get("summary"),
            "run": run,
            "run_job_id": run_job_id,
            "document": document[:DOC_SHOWN_CHARS],
            "document_cut": max(len(document) - DOC_SHOWN_CHARS, 0),
            "newest": newest,
            "saved": saved,
            "in_flight": job.status not in TERMINAL_STATUSES,
            "workers": worker_liveness(),
        },
    )
