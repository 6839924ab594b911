"""Reads of the analyses domain. Every per-user read is scoped to the user *and* their
tenant, so a foreign id reads as missing (404), never as forbidden."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.db.models import Count, Exists, Max, OuterRef, Q, QuerySet, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from accounts.models import Tenant, User
from queueing.enqueue import Policy, queueing_lock_prefix
from queueing.planner import rows_walking
from runs.core import queries
from runs.exceptions import JobNotFound
from runs.models import (
    ACTIVE_STATUSES,
    RECORDABLE_STATUSES,
    AnalysisAudit,
    AnalysisJob,
    AnalysisRun,
    AuditAction,
    CreditEntry,
    JobCitation,
    JobStatus,
)
from runs.queue import ANALYSIS_QUEUE, PROCESS_JOB_KEY

#: Columns never loaded for listings: the document body can weigh megabytes.
HEAVY_FIELDS = ("doc_html",)


#: Age buckets of finished jobs with no run yet, oldest last. The first one ends at the
#: grace period (``SWEEP_GRACE_SECONDS``): jobs there are expected (the browser may still
#: save them); anything in a later bucket means the backstop sweep is not keeping up.
UNSAVED_AGE_BUCKETS = ("under_grace", "under_1h", "under_24h", "over_24h")


@dataclass(frozen=True, kw_only=True)
class QueueRow:
    user_id: int
    username: str
    tenant: str
    balance: int
    running: tuple[int, ...]
    pending: tuple[int, ...]
    queued: tuple[int, ...]
    finished: int
    unsaved: int


def credit_balance(*, user_id: int) -> int:
    """The user's balance: the sum of their signed ledger entries, read as the admission
    reads it (their balance mark plus the entries since, ``runs.models.CreditBalanceMark``)."""
    with connection.cursor() as cursor:
        cursor.execute(queries["credit_balance"], {"user_id": user_id})
        return int(cursor.fetchone()[0])


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


def unsaved_jobs() -> QuerySet[AnalysisJob]:
    """Finished analyses whose result is in no run yet (a job counts as saved when its run
    holds it or a newer job: docs/design.md#row-durability), the ghost runs. The candidates are the
    jobs not flagged ``run_saved`` (recording a run flags its job), read through the
    backstop's partial index, so counting them costs what is unsaved, not the table; an
    older job of a run whose newer job was saved is not flagged until the sweep meets it,
    so the run itself is checked too."""
    held = AnalysisRun.objects.filter(pk=OuterRef("run_id")).filter(
        Q(job_id__gte=OuterRef("pk")) | Q(job_id__isnull=True)
    )
    return (
        AnalysisJob.objects.filter(
            status__in=RECORDABLE_STATUSES,
            deleted_at__isnull=True,
            doc_html__isnull=False,
            results__isnull=False,
            run_saved=False,
        )
        .exclude(results={})
        .exclude(Exists(held))
        .annotate(ended_at=Coalesce("finished_at", "updated_at"))
    )


def unsaved_age_bounds() -> dict[str, tuple[datetime.timedelta, datetime.timedelta | None]]:
    """``bucket: (min age, max age)`` for :data:`UNSAVED_AGE_BUCKETS`."""
    grace = datetime.timedelta(seconds=int(settings.SWEEP_GRACE_SECONDS))
    hour, day = datetime.timedelta(hours=1), datetime.timedelta(days=1)
    return {
        "under_grace": (datetime.timedelta(0), grace),
        "under_1h": (grace, max(hour, grace)),
        "under_24h": (max(hour, grace), max(day, grace)),
        "over_24h": (max(day, grace), None),
    }


def unsaved_age_filter(bucket: str, *, now: datetime.datetime | None = None) -> Q:
    """The ``ended_at`` condition of one age bucket (on :func:`unsaved_jobs`)."""
    now = now or timezone.now()
    low, high = unsaved_age_bounds()[bucket]
    condition = Q(ended_at__lte=now - low)
    if high is not None:
        condition &= Q(ended_at__gt=now - high)
    return condition


def unsaved_counts_by_age() -> dict[str, int]:
    """How many finished jobs have no run yet, per age bucket (one query)."""
    now = timezone.now()
    counts = unsaved_jobs().aggregate(
        **{b: Count("pk", filter=unsaved_age_filter(b, now=now)) for b in UNSAVED_AGE_BUCKETS}
    )
    return {bucket: int(counts[bucket] or 0) for bucket in UNSAVED_AGE_BUCKETS}


def retryable_failed_jobs(
    *, user_id: int | None = None, since: datetime.datetime | None = None, limit: int = 10_000
) -> list[int]:
    """Ids of failed analyses (oldest first) not retried yet, optionally of one user and
    ended at or after ``since``. Read without locks: the retry re-checks each one."""
    retried = AnalysisAudit.objects.filter(job_id=OuterRef("pk"), action=AuditAction.RETRY)
    jobs = AnalysisJob.objects.filter(status=JobStatus.FAILED, deleted_at__isnull=True).exclude(
        Exists(retried)
    )
    if user_id is not None:
        jobs = jobs.filter(user_id=user_id)
    if since is not None:
        jobs = jobs.annotate(ended_at=Coalesce("finished_at", "updated_at")).filter(
            ended_at__gte=since
        )
    return list(jobs.order_by("id").values_list("pk", flat=True)[:limit])


def newest_job_ids(*, user: User, run_ids: Sequence[object]) -> set[int]:
    """The id of the newest job of each of the user's runs in ``run_ids`` (one query): the
    only job of a run a client should save."""
    if not run_ids:
        return set()
    return set(
        AnalysisJob.objects.filter(
            run_id__in=set(run_ids),
            user_id=user.pk,
            tenant_id=user.tenant_id,
            deleted_at__isnull=True,
        )
        .values("run_id")
        .annotate(newest=Max("id"))
        .values_list("newest", flat=True)
    )


def saved_job_ids(*, user: User, jobs: Sequence[AnalysisJob]) -> set[int]:
    """Ids of ``jobs`` that count as saved: their run holds them or a newer job of the
    run, or names no job (a legacy row: a client's save) — one query."""
    run_ids = {job.run_id for job in jobs}
    if not run_ids:
        return set()
    held = dict(
        AnalysisRun.objects.filter(
            pk__in=run_ids, user_id=user.pk, tenant_id=user.tenant_id
        ).values_list("pk", "job_id")
    )
    return {
        job.pk
        for job in jobs
        if job.run_id in held and (held[job.run_id] is None or held[job.run_id] >= job.pk)
    }


def queue_overview(*, user_id: int | None = None, live_only: bool = False) -> list[QueueRow]:
    """Per user: running, pending and queued jobs (ids), finished jobs and those with no
    run yet (counts) and the balance. Every user with an analysis job (or only those with
    live work, or ``user_id``), by username."""
    jobs = AnalysisJob.objects.filter(deleted_at__isnull=True)
    live = jobs.filter(status__in=(JobStatus.QUEUED, *ACTIVE_STATUSES))
    if user_id is not None:
        users = User.objects.filter(pk=user_id)
    else:
        users = User.objects.filter(pk__in=(live if live_only else jobs).values("user_id"))
    users = list(users.select_related("tenant").order_by("username"))
    ids = [u.pk for u in users]
    states: dict[int, list[tuple[int, str]]] = {pk: [] for pk in ids}
    for pk, owner, status in (
        live.filter(user_id__in=ids)
        .order_by("created_at", "id")
        .values_list("pk", "user", "status")
    ):
        states[owner].append((pk, status))
    finished = dict(
        jobs.filter(user_id__in=ids, status__in=RECORDABLE_STATUSES)
        .values_list("user")
        .annotate(n=Count("pk"))
        .order_by()
    )
    unsaved = dict(
        unsaved_jobs()
        .filter(user_id__in=ids)
        .values_list("user")
        .annotate(n=Count("pk"))
        .order_by()
    )
    balances = dict(
        CreditEntry.objects.filter(user_id__in=ids)
        .values_list("user")
        .annotate(total=Sum("amount"))
        .order_by()
    )
    return [
        QueueRow(
            user_id=user.pk,
            username=user.username,
            tenant=user.tenant.slug if user.tenant else "",
            balance=int(balances.get(user.pk) or 0),
            running=tuple(pk for pk, s in states[user.pk] if s == JobStatus.RUNNING),
            pending=tuple(pk for pk, s in states[user.pk] if s == JobStatus.PENDING),
            queued=tuple(pk for pk, s in states[user.pk] if s == JobStatus.QUEUED),
            finished=finished.get(user.pk, 0),
            unsaved=unsaved.get(user.pk, 0),
        )
        for user in users
    ]


_tenant_slugs: dict[int, str] = {}


def tenant_slug(tenant_id: int | None) -> str:
    """A tenant's slug, read once per process (a slug never changes: it is part of the
    tenant's keys and storage paths); "" for none."""
    if tenant_id is None:
        return ""
    slug = _tenant_slugs.get(tenant_id)
    if slug is None:
        slug = Tenant.objects.filter(pk=tenant_id).values_list("slug", flat=True).first()
        if slug is None:
            return ""
        _tenant_slugs[tenant_id] = slug
    return slug


def remember_tenant_slug(user: User) -> None:
    """Keep the slug of ``user``'s tenant when the caller already loaded the tenant (the
    API's token authentication does), so :func:`tenant_slug` reads nothing."""
    if User.tenant.is_cached(user) and user.tenant is not None:
        _tenant_slugs.setdefault(user.tenant.pk, user.tenant.slug)


@dataclass(frozen=True, kw_only=True)
class ResumeWork:
    """Which parts of the resume tick have anything to do (see :func:`resume_work`)."""

    #: Running jobs whose release window closed without a release (``expired_releases``).
    expired_releases: bool
    #: Queued jobs of deactivated users.
    deactivated: bool
    #: Users with queued work and nothing active (the serial queue's stuck keys).
    stuck: bool
    #: Active jobs idle past the grace whose ``process_job`` is gone.
    lost: bool
    #: Core runs no live job needs: held ones to cancel, released ones to fail.
    held_runs: bool


def resume_work(*, idle_seconds: float, held_seconds: float) -> ResumeWork:
    """Which parts of the resume tick have work, in one read-only statement (no lock, one
    round trip; ``resume_work`` in ``sql/runs.sql``, under ``queueing.planner``'s
    settings): each flag is its part's own batch
    predicate, read through the partial indexes of live rows. A part's batch still
    re-reads, locks and re-checks what it takes. ``idle_seconds``: the lost-job search's
    idle time; ``held_seconds``: the age past which a held run no job took expires."""
    params = {
        "idle_seconds": idle_seconds,
        "held_seconds": held_seconds,
        "lock_prefix": queueing_lock_prefix(PROCESS_JOB_KEY, Policy.EXCLUSIVE),
    }
    (row,) = rows_walking(queries["resume_work"], params)
    return ResumeWork(**row)
