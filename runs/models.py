"""Analyses: jobs in a per-user queue, the runs users keep, verdicts, credits, core state.

Models hold fields, constraints and tiny properties; every transition lives in
``runs.admission``, ``runs.processing``, ``runs.durability`` and ``runs.operations``.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models import Q

from accounts.models import Tenant, User


class ClockTimestamp(models.Func):
    """``clock_timestamp()``: when the statement ran, not when its transaction began, so
    rows inserted under the user's queue lock sort in the order the lock admitted them."""

    template = "clock_timestamp()"
    output_field = models.DateTimeField()


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    PENDING = "pending"
    RUNNING = "running"
    COMPLETE = "complete"
    FAILED = "failed"
    CANCELLED = "cancelled"


ACTIVE_STATUSES = (JobStatus.PENDING, JobStatus.RUNNING)
#: Statuses a run can be recorded from (the backstop sweep's and the client save's filter).
RECORDABLE_STATUSES = (JobStatus.COMPLETE, JobStatus.FAILED)
TERMINAL_STATUSES = (JobStatus.COMPLETE, JobStatus.FAILED, JobStatus.CANCELLED)


class CoreRunState(models.TextChoices):
    HELD = "held"
    RELEASED = "released"
    JUDGING = "judging"
    DONE = "done"
    FAILED = "failed"
    #: Its job ended before releasing it (cancelled, its release failed for good, its
    #: user deactivated): the provider did no work and the budget unit was given back.
    CANCELLED = "cancelled"


class CoreRun(models.Model):
    """The local core service's run: created held at admission (every synchronous check
    already passed), released when the queue reaches the job, then judged — or cancelled
    while still held, when its job ended without releasing it."""

    run_id = models.UUIDField(db_index=True)
    user = models.ForeignKey(User, on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=CoreRunState, default=CoreRunState.HELD)
    sources = models.JSONField(default=list, help_text="[{key, doi}] as validated at create.")
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    released_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "core_runs"
        ordering = ["-id"]
        indexes = [
            # The resume tick's held-run expiry reads only the runs not yet finished
            # (core_stale_held, core_abandoned_released), oldest first: never every run.
            models.Index(
                fields=["id"],
                name="core_runs_unfinished_idx",
                condition=models.Q(
                    state__in=[CoreRunState.HELD, CoreRunState.RELEASED, CoreRunState.JUDGING]
                ),
            )
        ]

    def __str__(self) -> str:
        return f"core run {self.pk} ({self.state})"


class CoreDailyUsage(models.Model):
    """Core runs created per tenant and UTC day, counted against ``CORE_DAILY_BUDGET``
    (a budget per tenant, so one tenant cannot exhaust another's) in one conditional
    UPSERT (so concurrent admissions can never overshoot it)."""

    # Indexed by core_daily_usage_tenant_day_uq (tenant first), not by a redundant FK index.
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+", db_index=False)
    day = models.DateField()
    used = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "core_daily_usage"
        ordering = ["-day", "tenant_id"]
        verbose_name_plural = "core daily usage"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "day"], name="core_daily_usage_tenant_day_uq")
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.day}: {self.used}"


class AnalysisJob(models.Model):
    """One requested analysis: first-pass jobs wait in their user's serial queue; delta
    re-checks (``delta_of_job`` set, same run) bypass it."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    # Indexed by analysis_jobs_queue_idx (user first), not by a redundant FK index.
    user = models.ForeignKey(
        User, on_delete=models.PROTECT, related_name="analysis_jobs", db_index=False
    )
    run_id = models.UUIDField(help_text="The run this job produces (shared by its deltas).")
    # Indexed by analysis_jobs_delta_idx, on the deltas alone (a first pass has none).
    delta_of_job = models.ForeignKey(
        "self",
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="deltas",
        db_index=False,
    )
    status = models.CharField(max_length=16, choices=JobStatus, default=JobStatus.QUEUED)
    title = models.CharField(max_length=200)
    doc_html = models.TextField(null=True, blank=True)
    sources = models.JSONField(default=list)
    results = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    core_run = models.ForeignKey(
        CoreRun, on_delete=models.PROTECT, null=True, blank=True, related_name="jobs"
    )
    release_attempts = models.PositiveIntegerField(default=0)
    run_saved = models.BooleanField(
        default=False,
        db_default=False,
        help_text="Its run holds it or a later job of the run (set by the run's writer).",
    )
    requeues = models.PositiveIntegerField(
        default=0,
        db_default=0,
        help_text="How often the resume tick re-enqueued its lost process_job.",
    )
    release_deadline = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    updated_at = models.DateTimeField(db_default=ClockTimestamp())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "analysis_jobs"
        ordering = ["-id"]
        constraints = [
            # Invariant 4 in the schema: the serial queue's lock decides, this index
            # makes a bug in that decision an error instead of a second running job.
            models.UniqueConstraint(
                fields=["user"],
                condition=Q(
                    status__in=ACTIVE_STATUSES,
                    delta_of_job__isnull=True,
                    deleted_at__isnull=True,
                ),
                name="analysis_jobs_one_active_per_user",
            ),
        ]
        indexes = [
            models.Index(fields=["user", "status", "created_at"], name="analysis_jobs_queue_idx"),
            models.Index(fields=["run_id"], name="analysis_jobs_run_idx"),
            models.Index(
                fields=["delta_of_job"],
                condition=Q(delta_of_job__isnull=False),
                name="analysis_jobs_delta_idx",
            ),
            # The resume tick's scans (stuck queues, expired releases, lost work) touch
            # only live jobs, a sliver of the table.
            models.Index(
                fields=["status", "updated_at"],
                condition=Q(status__in=(JobStatus.QUEUED, *ACTIVE_STATUSES)),
                name="analysis_jobs_live_idx",
            ),
            # The backstop sweep's scan: terminal jobs still holding a body whose run is
            # not saved, oldest first — only what the sweep has to do, however many
            # saved jobs the table holds.
            models.Index(
                fields=["updated_at"],
                condition=Q(
                    status__in=RECORDABLE_STATUSES,
                    deleted_at__isnull=True,
                    doc_html__isnull=False,
                    results__isnull=False,
                    run_saved=False,
                ),
                name="analysis_jobs_unsaved_idx",
            ),
            # The trim's scan: ended jobs that still hold a body.
            models.Index(
                fields=["finished_at"],
                condition=Q(doc_html__isnull=False, finished_at__isnull=False),
                name="analysis_jobs_trim_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"analysis job {self.pk} ({self.status})"

    @property
    def is_delta(self) -> bool:
        return self.delta_of_job_id is not None


class SavedBy(models.TextChoices):
    CLIENT = "client"
    WORKER = "worker"


class AnalysisRun(models.Model):
    """The user-facing artifact (the side panel reads it). Two writers, one UPSERT with
    precedence (``runs/sql/runs.sql``: ``record_run``); ``saved_by`` NULL is a legacy row
    and counts as a client save."""

    id = models.UUIDField(primary_key=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    user = models.ForeignKey(
        User, on_delete=models.PROTECT, related_name="analysis_runs", db_index=False
    )
    job = models.ForeignKey(
        AnalysisJob, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    title = models.CharField(max_length=200, blank=True, default="")
    doc_html = models.TextField(null=True, blank=True)
    results = models.JSONField(null=True, blank=True)
    saved_by = models.CharField(max_length=8, choices=SavedBy, null=True, blank=True)
    version = models.PositiveIntegerField(
        default=1, help_text="Bumped on every rewrite; the judge runs once per version."
    )
    created_at = models.DateTimeField(db_default=ClockTimestamp())
    updated_at = models.DateTimeField(db_default=ClockTimestamp())

    class Meta:
        db_table = "analysis_runs"
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["user", "-created_at"], name="analysis_runs_user_idx")]

    def __str__(self) -> str:
        return f"run {self.pk} ({self.saved_by or 'legacy'})"


class RunJudgement(models.Model):
    """The judge/diagnostics result of one recorded run version. Kept beside the run, not
    in it, so judging never adds a tuple write to ``analysis_runs``."""

    # Indexed by run_judgements_once (run first), not by a redundant FK index.
    run = models.ForeignKey(
        AnalysisRun, on_delete=models.CASCADE, related_name="judgements", db_index=False
    )
    version = models.PositiveIntegerField()
    summary = models.JSONField(default=dict)
    judged_at = models.DateTimeField()

    class Meta:
        db_table = "run_judgements"
        ordering = ["-judged_at"]
        constraints = [
            models.UniqueConstraint(fields=["run", "version"], name="run_judgements_once"),
        ]

    def __str__(self) -> str:
        return f"judgement of {self.run_id} v{self.version}"


class Verdict(models.TextChoices):
    SUPPORTED = "supported"
    PARTIAL = "partial"
    UNSUPPORTED = "unsupported"
    MISSING_SOURCE = "missing_source"


class JobCitation(models.Model):
    """One citation of a job's document and the judge's verdict against its source."""

    # Indexed by job_citations_marker_once (job first), not by a redundant FK index.
    job = models.ForeignKey(
        AnalysisJob, on_delete=models.CASCADE, related_name="citations", db_index=False
    )
    marker = models.CharField(max_length=64)
    source_key = models.CharField(max_length=64)
    claim = models.TextField(blank=True, default="")
    verdict = models.CharField(max_length=16, choices=Verdict)
    score = models.FloatField()

    class Meta:
        db_table = "job_citations"
        ordering = ["job", "id"]
        constraints = [
            models.UniqueConstraint(fields=["job", "marker"], name="job_citations_marker_once"),
        ]

    def __str__(self) -> str:
        return f"{self.marker} → {self.source_key}: {self.verdict}"


class CreditKind(models.TextChoices):
    GRANT = "grant"
    CHARGE = "charge"
    REFUND = "refund"


class CreditEntry(models.Model):
    """A signed credit movement; a user's balance is the sum of their entries (read as
    their :class:`CreditBalanceMark` plus the entries since).

    Charges and refunds name their job and are unique per (job, kind), so each happens at
    most once; grants name no job (NULLs never conflict), so there may be many.
    """

    user = models.ForeignKey(
        User, on_delete=models.PROTECT, related_name="credit_entries", db_index=False
    )
    # Indexed by credit_ledger_once_per_job (job first), not by a redundant FK index.
    job = models.ForeignKey(
        AnalysisJob,
        on_delete=models.PROTECT,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    kind = models.CharField(max_length=8, choices=CreditKind)
    amount = models.BigIntegerField()
    note = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "credit_ledger"
        ordering = ["-id"]
        verbose_name_plural = "credit ledger"
        constraints = [
            models.UniqueConstraint(fields=["job", "kind"], name="credit_ledger_once_per_job"),
            models.CheckConstraint(
                condition=(
                    Q(kind=CreditKind.GRANT, job__isnull=True, amount__gt=0)
                    | Q(kind=CreditKind.CHARGE, job__isnull=False, amount__lt=0)
                    | Q(kind=CreditKind.REFUND, job__isnull=False, amount__gt=0)
                ),
                name="credit_ledger_kind_shape",
            ),
        ]
        indexes = [models.Index(fields=["user", "kind"], name="credit_ledger_user_idx")]

    def __str__(self) -> str:
        return f"{self.kind} {self.amount:+d} for {self.user_id}"


class Xid8Field(models.Field):
    """A PostgreSQL ``xid8``: a 64-bit transaction id, as ``pg_current_xact_id()`` gives
    it. Only SQL reads and writes it (``runs/sql/runs.sql``)."""

    description = "a 64-bit PostgreSQL transaction id"

    def db_type(self, connection: Any) -> str:
        return "xid8"


class CreditBalanceMark(models.Model):
    """A user's balance up to a point of the ledger, so that the admission's balance check
    reads one row and the entries since, not the whole history: ``balance`` is the sum of
    every entry whose transaction id (``credit_ledger.created_xid``, the inserting
    transaction's, a column only SQL knows) is below ``horizon``. A horizon is the
    snapshot xmin of the statement that folded the entries, so every transaction below it
    had ended, and each entry it leaves out (an uncommitted one included) has an id at or
    above it: the balance is ``balance`` plus the sum of the user's entries from
    ``horizon`` on, whoever reads it. ``cluster`` is the server's system identifier: a mark
    restored into another cluster (whose transaction ids are not this one's) is ignored
    and folded again. Written only by an admission, under the user's queue lock
    (``runs/sql/runs.sql``, ``admit_fold``); derived from the ledger, never edited."""

    user = models.OneToOneField(
        User, on_delete=models.CASCADE, primary_key=True, related_name="credit_balance_mark"
    )
    balance = models.BigIntegerField()
    horizon = Xid8Field()
    cluster = models.BigIntegerField()
    entries = models.BigIntegerField(help_text="how many ledger entries the balance folds")
    folded_at = models.DateTimeField()

    class Meta:
        db_table = "credit_balance_marks"

    def __str__(self) -> str:
        return f"{self.balance} for {self.user_id} below {self.horizon}"


class AuditAction(models.TextChoices):
    RETRY = "retry"


class AnalysisAudit(models.Model):
    """An operator's action on an analysis job: who did what, when, and what came of it.
    Append-only; a retry is recorded once per job (the unique index makes a second retry
    of the same job find the first)."""

    # Indexed by analysis_audit_tenant_idx (tenant first), not by a redundant FK index.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    job = models.ForeignKey(AnalysisJob, on_delete=models.PROTECT, related_name="audit")
    action = models.CharField(max_length=32, choices=AuditAction)
    actor = models.CharField(max_length=150)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "analysis_audit"
        ordering = ["-id"]
        verbose_name = "analysis audit entry"
        verbose_name_plural = "analysis audit log"
        constraints = [
            models.UniqueConstraint(
                fields=["job"],
                condition=Q(action="retry"),
                name="analysis_audit_retry_once",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "-id"], name="analysis_audit_tenant_idx")]

    def __str__(self) -> str:
        return f"{self.action} of job {self.job_id} by {self.actor}"
