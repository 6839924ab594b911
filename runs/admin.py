"""Admin for the analyses' tables. Every row is system-owned (written by services under
locks and compare-and-set), so the admin is read-only; its actions call the services."""

from __future__ import annotations

from django.contrib import admin, messages

from runs import services
from runs.models import (
    AnalysisJob,
    AnalysisRun,
    CoreDailyUsage,
    CoreRun,
    CreditEntry,
    JobCitation,
    RunJudgement,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


def _body_size(obj) -> str:
    return "trimmed" if obj.doc_html is None else f"{len(obj.doc_html):,} chars"


@admin.register(AnalysisJob)
class AnalysisJobAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "user",
        "status",
        "title",
        "delta_of_job",
        "release_attempts",
        "created_at",
        "finished_at",
    )
    list_filter = ("status",)
    search_fields = ("title", "user__username", "=run_id")
    list_select_related = ("user",)
    exclude = ("doc_html",)
    readonly_fields = ("body",)
    actions = ("cancel_queued", "promote_queue")

    @admin.display(description="doc_html")
    def body(self, obj: AnalysisJob) -> str:
        return _body_size(obj)

    @admin.action(description="Cancel selected queued jobs (refunds their credit)")
    def cancel_queued(self, request, queryset):
        cancelled = sum(
            services.analysis_job_cancel(job_id=pk) for pk in queryset.values_list("pk", flat=True)
        )
        self.message_user(request, f"Cancelled {cancelled} queued job(s).", messages.SUCCESS)

    @admin.action(description="Promote the queues of the selected jobs' users")
    def promote_queue(self, request, queryset):
        users = set(queryset.values_list("user_id", flat=True))
        promoted = [j for u in users if (j := services.analysis_queue_promote(user_id=u))]
        self.message_user(
            request, f"Promoted {len(promoted)} job(s) for {len(users)} user(s).", messages.SUCCESS
        )


@admin.register(AnalysisRun)
class AnalysisRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "user", "title", "job", "saved_by", "version", "created_at")
    list_filter = ("saved_by",)
    search_fields = ("=id", "title", "user__username")
    list_select_related = ("user",)
    exclude = ("doc_html",)
    readonly_fields = ("body",)

    @admin.display(description="doc_html")
    def body(self, obj: AnalysisRun) -> str:
        return _body_size(obj)


@admin.register(RunJudgement)
class RunJudgementAdmin(ReadOnlyAdmin):
    list_display = ("run", "version", "judged_at")


@admin.register(JobCitation)
class JobCitationAdmin(ReadOnlyAdmin):
    list_display = ("job", "marker", "source_key", "verdict", "score")
    list_filter = ("verdict",)


@admin.register(CoreRun)
class CoreRunAdmin(ReadOnlyAdmin):
    list_display = ("id", "run_id", "user", "state", "created_at", "released_at", "finished_at")
    list_filter = ("state",)


@admin.register(CoreDailyUsage)
class CoreDailyUsageAdmin(ReadOnlyAdmin):
    list_display = ("day", "used")


@admin.register(CreditEntry)
class CreditEntryAdmin(ReadOnlyAdmin):
    """Grants are made with ``manage.py grant_credits`` (a service call)."""

    list_display = ("id", "user", "kind", "amount", "job", "note", "created_at")
    list_filter = ("kind",)
    search_fields = ("user__username",)
    list_select_related = ("user",)
