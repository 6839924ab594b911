"""Admin for the analyses' tables. Every row is system-owned (written by services under
locks and compare-and-set), so the admin is read-only; its actions call the services:
cancel, requeue, refund, promote, retry (previewed, then audited). Jobs and runs link
procrastinate's jobs of their keys. The "run" filter finds finished jobs with no run yet, by age.

Each action needs the change permission on analysis jobs; the two that give credit back
(cancel, refund) also the add permission on the credit ledger.

Listings never load ``doc_html`` (it can weigh megabytes): they show its size.
"""

from __future__ import annotations

from collections import Counter

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import QuerySet
from django.db.models.functions import Length
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html

from queueing.admin import ReadOnlyModelAdmin, jobs_link
from runs import admission, operations
from runs.exceptions import RunsError
from runs.models import (
    AnalysisAudit,
    AnalysisJob,
    AnalysisRun,
    CoreDailyUsage,
    CoreRun,
    CreditEntry,
    JobCitation,
    JobStatus,
    RunJudgement,
)
from runs.queue import JUDGE_RUN_KEY, PROCESS_JOB_KEY
from runs.selectors import queue_position, unsaved_age_filter, unsaved_jobs


def _change_link(model: str, pk: object) -> str:
    """A link to a related row by its id: listing ``str(related)`` would load the related
    row (and a job's megabyte body) once per line."""
    if pk is None:
        return ""
    return format_html('<a href="{}">{}</a>', reverse(f"admin:runs_{model}_change", args=[pk]), pk)


def _body_size(obj) -> str:
    chars = obj.doc_html_chars
    return "trimmed" if chars is None else f"{chars:,} chars"


def _light(queryset: QuerySet) -> QuerySet:
    return queryset.defer("doc_html").annotate(doc_html_chars=Length("doc_html"))


def _summary(counts: Counter, labels: dict[str, str]) -> str:
    parts = [f"{counts[key]} {label}" for key, label in labels.items() if counts[key]]
    return "; ".join(parts) or "nothing to do"


class DeltaFilter(admin.SimpleListFilter):
    title = "kind"
    parameter_name = "delta"

    def lookups(self, request, model_admin):
        return [("no", "first pass"), ("yes", "delta re-check")]

    def queryset(self, request, queryset):
        if self.value() in ("yes", "no"):
            return queryset.filter(delta_of_job__isnull=self.value() == "no")
        return queryset


class NoRunYetFilter(admin.SimpleListFilter):
    """Finished jobs whose result is in no run yet (the seed's ghost runs), by age. Past
    the grace period the backstop sweep should have recorded them."""

    title = "run"
    parameter_name = "no_run"
    ANY = "any"
    AGES = {
        "under_grace": "no run yet, within the grace period",
        "under_1h": "no run yet, past the grace period",
        "under_24h": "no run yet, over an hour",
        "over_24h": "no run yet, over a day",
    }

    def lookups(self, request, model_admin):
        return [(self.ANY, "no run yet (finished, not saved)"), *self.AGES.items()]

    def queryset(self, request, queryset):
        value = self.value()
        if value != self.ANY and value not in self.AGES:
            return queryset
        unsaved = unsaved_jobs()
        if value in self.AGES:
            unsaved = unsaved.filter(unsaved_age_filter(value))
        return queryset.filter(pk__in=unsaved.values("pk"))


@admin.register(AnalysisJob)
class AnalysisJobAdmin(ReadOnlyModelAdmin):
    list_display = (
        "id",
        "title",
        "user",
        "status",
        "position",
        "delta_of",
        "created_at",
        "finished_at",
        "jobs",
    )
    list_filter = (
        "status",
        NoRunYetFilter,
        DeltaFilter,
        "tenant",
        ("user", admin.RelatedOnlyFieldListFilter),
    )
    list_select_related = ("user", "tenant")
    search_fields = ("id__exact", "title", "user__username", "run_id__exact")
    date_hierarchy = "created_at"
    exclude = ("doc_html",)
    readonly_fields = ("body",)
    actions = ("cancel_queued", "requeue", "refund", "promote_queue", "retry_failed")

    def get_queryset(self, request):
        return _light(super().get_queryset(request))

    @admin.display(description="doc_html")
    def body(self, obj: AnalysisJob) -> str:
        return _body_size(obj)

    @admin.display(description="delta of")
    def delta_of(self, obj: AnalysisJob) -> str:
        return _change_link("analysisjob", obj.delta_of_job_id)

    @admin.display(description="queue position")
    def position(self, obj: AnalysisJob) -> str:
        return str(queue_position(obj)) if obj.status == JobStatus.QUEUED else ""

    @admin.display(description="procrastinate")
    def jobs(self, obj: AnalysisJob) -> str:
        return jobs_link(PROCESS_JOB_KEY.build(job=obj.pk))

    def has_credits_permission(self, request) -> bool:
        # The actions that write the credit ledger: a refund, or the charge of a new job.
        return self.has_operate_permission(request) and request.user.has_perm(
            "runs.add_creditentry"
        )

    @admin.action(
        description="Cancel selected queued jobs (refunds their credit)", permissions=["credits"]
    )
    def cancel_queued(self, request, queryset):
        # Only queued jobs can be cancelled; the others are counted, not locked.
        ids = list(queryset.values_list("pk", flat=True))
        queued = queryset.filter(status=JobStatus.QUEUED).values_list("pk", flat=True)
        cancelled = sum(admission.analysis_job_cancel(job_id=pk) for pk in queued)
        skipped = len(ids) - cancelled
        self.message_user(
            request,
            f"Cancelled {cancelled} queued job(s) and refunded their credit"
            + (f"; {skipped} job(s) were not queued and were left alone." if skipped else "."),
            messages.SUCCESS if cancelled else messages.WARNING,
        )

    @admin.action(
        description="Requeue selected pending or running jobs (their process_job)",
        permissions=["operate"],
    )
    def requeue(self, request, queryset):
        outcomes = Counter(
            operations.analysis_job_requeue(job_id=pk)
            for pk in queryset.values_list("pk", flat=True)
        )
        text = _summary(
            outcomes,
            {
                operations.RequeueOutcome.ENQUEUED: "requeued",
                operations.RequeueOutcome.ALREADY_WAITING: (
                    "already had their job waiting, retrying or running"
                ),
                operations.RequeueOutcome.NOT_ACTIVE: (
                    "not requeued: queued (waiting for their turn) or already finished"
                ),
            },
        )
        enqueued = outcomes[operations.RequeueOutcome.ENQUEUED]
        self.message_user(
            request, f"Requeue: {text}.", messages.SUCCESS if enqueued else messages.WARNING
        )

    @admin.action(
        description="Refund selected finished jobs (once per job)", permissions=["credits"]
    )
    def refund(self, request, queryset):
        note = f"refunded by admin:{request.user.get_username()}"
        outcomes = Counter(
            operations.analysis_job_refund(job_id=pk, note=note)
            for pk in queryset.values_list("pk", flat=True)
        )
        text = _summary(
            outcomes,
            {
                operations.RefundOutcome.REFUNDED: "refunded",
                operations.RefundOutcome.ALREADY_REFUNDED: "already refunded (nothing added)",
                operations.RefundOutcome.NOT_FINISHED: "not finished yet (cancel or wait)",
                operations.RefundOutcome.NOT_CHARGED: "never charged",
                operations.RefundOutcome.MISSING: "deleted",
            },
        )
        refunded = outcomes[operations.RefundOutcome.REFUNDED]
        self.message_user(
            request, f"Refund: {text}.", messages.SUCCESS if refunded else messages.WARNING
        )

    @admin.action(
        description="Promote the queues of the selected jobs' users", permissions=["operate"]
    )
    def promote_queue(self, request, queryset):
        users = set(queryset.values_list("user_id", flat=True))
        promoted = [j for u in users if (j := admission.analysis_queue_promote(user_id=u))]
        self.message_user(
            request,
            f"Promoted {len(promoted)} job(s) for {len(users)} user(s)"
            + ("" if promoted else " (each already has an active job or nothing queued)")
            + ".",
            messages.SUCCESS if promoted else messages.WARNING,
        )

    @admin.action(
        description="Retry selected failed jobs as new jobs of their runs (audited; previewed)",
        permissions=["credits"],
    )
    def retry_failed(self, request, queryset):
        """First a preview page (each job: what its retry would replace in the user's run,
        or why it is refused), written by the dry run of the same service; the retry
        happens when the operator confirms it there."""
        ids = list(queryset.values_list("pk", flat=True))
        if request.POST.get("confirm") != "yes":
            return self._retry_preview(request, ids)
        actor = f"admin:{request.user.get_username()}"
        outcomes: Counter = Counter()
        refusals = []
        for pk in ids:
            try:
                outcomes[operations.analysis_job_retry(job_id=pk, actor=actor).outcome] += 1
            except RunsError as exc:
                refusals.append(f"#{pk}: {exc}")
        text = _summary(
            outcomes,
            {
                operations.RetryOutcome.RETRIED: "retried",
                operations.RetryOutcome.ALREADY_RETRIED: "already retried (nothing added)",
            },
        )
        if refusals:
            text += f"; {len(refusals)} refused ({'; '.join(refusals[:5])})"
        retried = outcomes[operations.RetryOutcome.RETRIED]
        self.message_user(
            request, f"Retry: {text}.", messages.SUCCESS if retried else messages.WARNING
        )
        return None

    def _retry_preview(self, request, ids: list[int]) -> TemplateResponse:
        rows = []
        for pk in ids:
            try:
                dry = operations.analysis_job_retry(job_id=pk, actor="preview", dry_run=True)
            except RunsError as exc:
                rows.append({"job_id": pk, "outcome": "refused", "detail": str(exc)})
                continue
            detail = dry.replaces
            if dry.outcome is operations.RetryOutcome.ALREADY_RETRIED:
                detail = f"retried before as job {dry.new_job_id}"
            rows.append(
                {"job_id": pk, "outcome": dry.outcome.value.replace("_", " "), "detail": detail}
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Retry failed jobs: what each retry would replace",
            "opts": self.opts,
            "rows": rows,
            "ids": ids,
            "retryable": sum(r["outcome"] == "would retry" for r in rows),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        }
        return TemplateResponse(request, "admin/runs/retry_preview.html", context)


@admin.register(AnalysisAudit)
class AnalysisAuditAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "created_at", "tenant", "action", "job_link", "new_job", "actor")
    list_filter = ("action", "tenant")
    list_select_related = ("tenant",)
    search_fields = ("job__id__exact", "actor")
    date_hierarchy = "created_at"

    @admin.display(description="job")
    def job_link(self, obj: AnalysisAudit) -> str:
        return _change_link("analysisjob", obj.job_id)

    @admin.display(description="new job")
    def new_job(self, obj: AnalysisAudit) -> str:
        return _change_link("analysisjob", (obj.payload or {}).get("new_job_id"))


@admin.register(AnalysisRun)
class AnalysisRunAdmin(ReadOnlyModelAdmin):
    list_display = (
        "id",
        "title",
        "user",
        "tenant",
        "job_link",
        "saved",
        "version",
        "created_at",
        "updated_at",
        "jobs",
    )
    list_filter = ("saved_by", "tenant", ("user", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("user", "tenant")
    search_fields = ("id__exact", "title", "user__username", "job__id__exact")
    date_hierarchy = "created_at"
    exclude = ("doc_html",)
    readonly_fields = ("body",)

    def get_queryset(self, request):
        return _light(super().get_queryset(request))

    @admin.display(description="doc_html")
    def body(self, obj: AnalysisRun) -> str:
        return _body_size(obj)

    @admin.display(description="job")
    def job_link(self, obj: AnalysisRun) -> str:
        return _change_link("analysisjob", obj.job_id)

    @admin.display(description="saved by", ordering="saved_by")
    def saved(self, obj: AnalysisRun) -> str:
        # A legacy NULL counts as a client save (docs/design.md#row-durability).
        return obj.saved_by or "legacy (client)"

    @admin.display(description="procrastinate")
    def jobs(self, obj: AnalysisRun) -> str:
        keys = (JUDGE_RUN_KEY.build(run=obj.pk, version=v) for v in range(1, obj.version + 1))
        return jobs_link(*keys, label="judge jobs")


@admin.register(RunJudgement)
class RunJudgementAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "run_link", "version", "judged_at")
    search_fields = ("run__id__exact",)
    date_hierarchy = "judged_at"

    @admin.display(description="run")
    def run_link(self, obj: RunJudgement) -> str:
        return _change_link("analysisrun", obj.run_id)


@admin.register(JobCitation)
class JobCitationAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "job_link", "marker", "source_key", "verdict", "score")
    list_filter = ("verdict",)
    search_fields = ("job__id__exact", "marker", "source_key")

    @admin.display(description="job")
    def job_link(self, obj: JobCitation) -> str:
        return _change_link("analysisjob", obj.job_id)


@admin.register(CoreRun)
class CoreRunAdmin(ReadOnlyModelAdmin):
    list_display = ("id", "run_id", "user", "state", "created_at", "released_at", "finished_at")
    list_filter = ("state", ("user", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("user",)
    search_fields = ("id__exact", "run_id__exact", "user__username")
    date_hierarchy = "created_at"


@admin.register(CoreDailyUsage)
class CoreDailyUsageAdmin(ReadOnlyModelAdmin):
    list_display = ("day", "tenant", "used")
    list_filter = ("tenant",)
    list_select_related = ("tenant",)
    date_hierarchy = "day"


@admin.register(CreditEntry)
class CreditEntryAdmin(ReadOnlyModelAdmin):
    """Grants are made with ``manage.py grant_credits``, refunds with the jobs' *Refund*
    action (service calls)."""

    list_display = ("id", "user", "kind", "amount", "job_link", "note", "created_at")
    list_filter = ("kind", "user__tenant", ("user", admin.RelatedOnlyFieldListFilter))
    list_select_related = ("user",)
    search_fields = ("user__username", "job__id__exact", "note")
    date_hierarchy = "created_at"

    @admin.display(description="job")
    def job_link(self, obj: CreditEntry) -> str:
        return _change_link("analysisjob", obj.job_id)
