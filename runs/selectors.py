"""Reads of the analyses domain. Every per-user read is scoped to the user *and* their
tenant, so a foreign id reads as missing (404), never as forbidden."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import QuerySet, Sum

from accounts.models import User
from runs.exceptions import JobNotFound
from runs.models import (
    ACTIVE_STATUSES,
    AnalysisJob,
    AnalysisRun,
    CreditEntry,
    JobCitation,
    JobStatus,
)
from runs.queue import ANALYSIS_QUEUE

#: Columns never loaded for listings: the document body can weigh megabytes.
HEAVY_FIELDS = ("doc_html",)


@dataclass(frozen=True, kw_only=True)
class QueueRow:
    user_id: int
    username: str
    tenant: str
    balance: int
    running: tuple[int, ...]
    pending: tuple[int, ...]
    queued: tuple[int, ...]


def credit_balance(*, user_id: int) -> int:
    """The user's balance: the sum of their signed ledger entries."""
    total = CreditEntry.objects.filter(user_id=user_id).aggregate(total=Sum("amount"))["total"]
    return int(total or 0)


def analysis_job_for_user(*, user: User, job_id: int) -> AnalysisJob:
    """The user's job (body deferred), or :class:`JobNotFound` for a missing or foreign id."""
    job = (
        AnalysisJob.objects.defer(*HEAVY_FIELDS)
        .filter(pk=job_id, user_id=user.pk, tenant_id=user.tenant_id, deleted_at__isnull=True)
        .first()
    )
    if job is None:
        raise JobNotFound()
    return job


def analysis_jobs_of_user(*, user: User) -> QuerySet[AnalysisJob]:
    """All the user's jobs (body deferred), unordered: the API pages them."""
    return AnalysisJob.objects.defer(*HEAVY_FIELDS).filter(
        user_id=user.pk, tenant_id=user.tenant_id, deleted_at__isnull=True
    )


def analysis_jobs_for_user(*, user: User, limit: int = 50) -> list[AnalysisJob]:
    """The user's newest jobs (body deferred)."""
    return list(analysis_jobs_of_user(user=user).order_by("-created_at", "-id")[:limit])


def queue_position(job: AnalysisJob) -> int:
    """1-based position among the user's queued first-pass jobs; 0 when not queued."""
    if job.status != JobStatus.QUEUED or job.is_delta:
        return 0
    return ANALYSIS_QUEUE.position(key=job.user_id, row_id=job.pk, created=job.created_at)


def queue_positions(jobs: Sequence[AnalysisJob]) -> dict[int, int]:
    """Positions for several jobs of one user with one query per user."""
    positions = {job.pk: 0 for job in jobs}
    users = {job.user_id for job in jobs if job.status == JobStatus.QUEUED and not job.is_delta}
    for user_id in users:
        queued = (
            AnalysisJob.objects.filter(
                user_id=user_id,
                status=JobStatus.QUEUED,
                delta_of_job__isnull=True,
                deleted_at__isnull=True,
            )
            .order_by("created_at", "id")
            .values_list("pk", flat=True)
        )
        for index, pk in enumerate(queued, start=1):
            if pk in positions:
                positions[pk] = index
    return positions


def job_citations(*, job_id: int) -> QuerySet[JobCitation]:
    """The job's citations with their verdicts (unordered: callers order or page them)."""
    return JobCitation.objects.filter(job_id=job_id)


def analysis_runs_of_user(*, user: User) -> QuerySet[AnalysisRun]:
    """All the user's runs (body deferred), unordered: the API pages them."""
    return AnalysisRun.objects.defer(*HEAVY_FIELDS).filter(
        user_id=user.pk, tenant_id=user.tenant_id
    )


def analysis_runs_for_user(*, user: User, limit: int = 50) -> QuerySet[AnalysisRun]:
    """The user's runs, newest first (the side panel), body deferred."""
    return analysis_runs_of_user(user=user).order_by("-created_at", "-id")[:limit]


def queue_overview(*, user_id: int | None = None) -> list[QueueRow]:
    """Running, pending and queued jobs per user (users with live work, or ``user_id``)."""
    live = AnalysisJob.objects.filter(
        status__in=(JobStatus.QUEUED, *ACTIVE_STATUSES), deleted_at__isnull=True
    )
    if user_id is not None:
        users = User.objects.filter(pk=user_id)
    else:
        users = User.objects.filter(pk__in=live.values("user_id"))
    rows = []
    for user in users.select_related("tenant").order_by("username"):
        jobs = list(
            live.filter(user_id=user.pk).order_by("created_at", "id").values_list("pk", "status")
        )
        rows.append(
            QueueRow(
                user_id=user.pk,
                username=user.username,
                tenant=user.tenant.slug if user.tenant else "",
                balance=credit_balance(user_id=user.pk),
                running=tuple(pk for pk, s in jobs if s == JobStatus.RUNNING),
                pending=tuple(pk for pk, s in jobs if s == JobStatus.PENDING),
                queued=tuple(pk for pk, s in jobs if s == JobStatus.QUEUED),
            )
        )
    return rows
