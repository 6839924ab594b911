"""The user's dashboard: their analyses (running and queued, with positions), their runs
side panel, and their tenant's inquiries as a stage board; plus a form to submit an
analysis.

Server-rendered. Every read goes through the domains' selectors, scoped to the logged-in
user and their tenant, so nobody sees another tenant's rows. The page reloads itself every
2 s while work is in flight, and (being the browser the design speaks of) saves each
finished analysis through ``POST /api/analysis-runs``: the fast path the backstop sweep
only covers for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from accounts.models import User
from config.metrics import record_admission_rejection
from pipeline import selectors as pipeline_selectors
from pipeline.models import Anfrage
from pipeline.selectors import StageStatus
from runs import admission as runs_admission
from runs import selectors as runs_selectors
from runs.api import MAX_DOC_CHARS, MAX_SOURCE_TEXT_CHARS, SOURCE_KEY_PATTERN
from runs.exceptions import InsufficientCredits, RunsError
from runs.models import (
    ACTIVE_STATUSES,
    RECORDABLE_STATUSES,
    AnalysisJob,
    AnalysisRun,
    JobStatus,
)

LOGIN_URL = "login"
LIVE_STATUSES = (JobStatus.RUNNING, JobStatus.PENDING, JobStatus.QUEUED)
#: Enough to hold a busy user's whole queue; older finished jobs fall off the page.
JOB_LIMIT = 100
RECENT_LIMIT = 10
RUN_LIMIT = 20
ANFRAGE_LIMIT = 20


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
        statuses = {s.status for s in self.stages}
        if "running" in statuses:
            return True
        return "failed" not in statuses and statuses != {"success"}


def _saved_job_ids(user: User, jobs: list[AnalysisJob]) -> set[int]:
    """Ids of ``jobs`` that count as saved: their run holds them or a later job of the run
    (one query, keyed by run id). A superseded job is never offered for a save."""
    run_ids = {job.run_id for job in jobs}
    if not run_ids:
        return set()
    held = dict(
        AnalysisRun.objects.filter(pk__in=run_ids, user_id=user.pk, tenant_id=user.tenant_id)
        .exclude(job_id__isnull=True)
        .values_list("pk", "job_id")
    )
    return {job.pk for job in jobs if job.run_id in held and held[job.run_id] >= job.pk}


def _job_sort_key(row: JobRow) -> tuple[int, int, int]:
    return (LIVE_STATUSES.index(row.job.status), row.position, row.job.pk)


def dashboard_context(user: User) -> dict[str, Any]:
    """Everything the page shows, read for ``user`` and their tenant only."""
    jobs = runs_selectors.analysis_jobs_for_user(user=user, limit=JOB_LIMIT)
    positions = runs_selectors.queue_positions(jobs)
    live = [j for j in jobs if j.status in LIVE_STATUSES]
    recent = [j for j in jobs if j.status not in LIVE_STATUSES][:RECENT_LIMIT]
    saved = _saved_job_ids(user, [j for j in recent if j.status in RECORDABLE_STATUSES])
    live_rows = sorted(
        (JobRow(job=j, position=positions[j.pk], unsaved=False) for j in live),
        key=_job_sort_key,
    )
    recent_rows = [
        JobRow(
            job=j,
            position=0,
            unsaved=(
                j.status in RECORDABLE_STATUSES and j.results is not None and j.pk not in saved
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
    }


def _render(request: HttpRequest, form: AnalysisForm, *, status: int = 200) -> HttpResponse:
    user = request.user
    if user.tenant_id is None:
        return render(request, "dashboard/no_tenant.html", status=403)
    context = dashboard_context(user) | {"form": form}
    return render(request, "dashboard/index.html", context, status=status)


@require_GET
@login_required(login_url=LOGIN_URL)
def dashboard_view(request: HttpRequest) -> HttpResponse:
    return _render(request, AnalysisForm())


@require_POST
@login_required(login_url=LOGIN_URL)
def analysis_submit_view(request: HttpRequest) -> HttpResponse:
    """Admit an analysis through the same service as the API: on success redirect back
    (post/redirect/get); on bad input or a refusal re-render the form with the reason
    and a 4xx status, having written nothing."""
    form = AnalysisForm(request.POST)
    if request.user.tenant_id is None or not form.is_valid():
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
    messages.success(request, f"Analysis #{admission.id} admitted, {where}.")
    return redirect("dashboard")
