"""Admin for inquiries, stage runs, positions, files, warnings, catalogs and the audit log.

Pipeline rows are written by the stages only, so they are read-only here; the replay
actions call the same service as ``manage.py replay_stage`` and need the change
permission on stage runs. A stage the resume sweep gave up on shows as ``failed (gave
up)`` (filter runs by *resume sweep*); replaying it gives it a fresh resume budget.
Catalogs are the tenants'
configuration and stay editable. Inquiries and runs link procrastinate's jobs of their
stage keys (``stage:tenant:anfrage``).
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.db.models import Prefetch
from django.utils.html import format_html
from django.utils.text import Truncator

from pipeline.exceptions import PipelineError
from pipeline.models import (
    Anfrage,
    AnfrageFile,
    AuditEntry,
    Catalog,
    CatalogItem,
    ExtractionWarning,
    PipelineRun,
    Position,
    Stage,
)
from pipeline.replay import pipeline_stage_replay
from pipeline.selectors import PENDING, catalog_for
from pipeline.stages import stage_key
from queueing.admin import ActionPermissionsMixin, ReadOnlyModelAdmin, jobs_link

#: How many refusal reasons one message lists (the rest are counted).
MAX_REASONS = 5


def _short(text: str, chars: int = 80) -> str:
    return Truncator(text).chars(chars)


#: A position's columns as operators read them (inline on the inquiry and in the list).
POSITION_FIELDS = [
    "position_index",
    "quantity",
    "unit",
    "item",
    "material",
    "length_mm",
    "feasible",
    "reason",
    "unit_price",
    "total",
]


class PositionInline(admin.TabularInline):
    model = Position
    fields = POSITION_FIELDS
    readonly_fields = POSITION_FIELDS
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class RunInline(admin.TabularInline):
    model = PipelineRun
    fields = [
        "stage",
        "shown_status",
        "attempts",
        "resumes",
        "started_at",
        "finished_at",
        "gave_up_at",
        "error",
    ]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="status")
    def shown_status(self, obj: PipelineRun) -> str:
        return obj.display_status


@admin.register(Anfrage)
class AnfrageAdmin(ReadOnlyModelAdmin):
    list_display = [
        "id",
        "title",
        "tenant",
        "stage_board",
        "quote_total",
        "currency",
        "created_at",
        "completed_at",
    ]
    list_filter = ["tenant"]
    list_select_related = ["tenant"]
    search_fields = ["id__exact", "title"]
    date_hierarchy = "created_at"
    readonly_fields = ["stage_jobs"]
    inlines = [RunInline, PositionInline]

    def get_queryset(self, request):
        runs = PipelineRun.objects.only("anfrage_id", "stage", "status", "gave_up_at")
        return super().get_queryset(request).prefetch_related(Prefetch("runs", queryset=runs))

    @admin.display(description="stages")
    def stage_board(self, obj: Anfrage) -> str:
        statuses = {run.stage: run.display_status for run in obj.runs.all()}
        return " · ".join(f"{stage.value} {statuses.get(stage.value, PENDING)}" for stage in Stage)

    @admin.display(description="procrastinate jobs")
    def stage_jobs(self, obj: Anfrage) -> str:
        return jobs_link(
            *(stage_key(stage=stage, anfrage=obj) for stage in Stage), label="all stages"
        )


def _replay(modeladmin, request, queryset, *, force: bool, cascade: bool) -> None:
    actor = f"admin:{request.user.get_username()}"
    enqueued = waiting = 0
    refused: list[str] = []
    for run in queryset.order_by("anfrage_id", "id"):
        try:
            result = pipeline_stage_replay(
                tenant_id=run.tenant_id,
                anfrage_id=run.anfrage_id,
                stage=run.stage,
                force=force,
                cascade=cascade,
                actor=actor,
            )
        except PipelineError as exc:
            refused.append(f"#{run.anfrage_id} {run.stage}: {exc.detail}")
            continue
        if result.enqueued:
            enqueued += 1
        else:
            waiting += 1
    if enqueued:
        modeladmin.message_user(
            request, f"{enqueued} stage(s) queued for replay (one job each).", messages.SUCCESS
        )
    if waiting:
        modeladmin.message_user(
            request,
            f"{waiting} stage(s) already had a job waiting or running; no second job was "
            "queued (the replay is audited and reopened what had succeeded).",
            messages.INFO,
        )
    if refused:
        more = len(refused) - MAX_REASONS
        modeladmin.message_user(
            request,
            f"{len(refused)} stage(s) refused: "
            + "; ".join(refused[:MAX_REASONS])
            + (f"; and {more} more" if more > 0 else ""),
            messages.WARNING,
        )


@admin.action(description="Replay stage (failed or abandoned runs)", permissions=["operate"])
def replay_stage(modeladmin, request, queryset) -> None:
    _replay(modeladmin, request, queryset, force=False, cascade=False)


@admin.action(description="Force replay stage and the stages after it", permissions=["operate"])
def force_replay_cascade(modeladmin, request, queryset) -> None:
    _replay(modeladmin, request, queryset, force=True, cascade=True)


class ResumeSweepFilter(admin.SimpleListFilter):
    title = "resume sweep"
    parameter_name = "resume"

    def lookups(self, request, model_admin):
        return [("gave_up", "gave up (needs a replay)"), ("resumed", "resumed at least once")]

    def queryset(self, request, queryset):
        if self.value() == "gave_up":
            return queryset.filter(gave_up_at__isnull=False, status="failed")
        if self.value() == "resumed":
            return queryset.filter(resumes__gt=0)
        return queryset


@admin.register(PipelineRun)
class PipelineRunAdmin(ReadOnlyModelAdmin):
    list_display = [
        "id",
        "anfrage",
        "tenant",
        "stage",
        "display_status",
        "attempts",
        "resumes",
        "started_at",
        "finished_at",
        "short_error",
        "jobs",
    ]
    list_filter = ["stage", "status", ResumeSweepFilter, "tenant"]
    list_select_related = ["anfrage__tenant", "tenant"]
    search_fields = ["anfrage__id__exact", "anfrage__title", "error"]
    date_hierarchy = "started_at"
    actions = [replay_stage, force_replay_cascade]

    @admin.display(description="status", ordering="status")
    def display_status(self, obj: PipelineRun) -> str:
        return obj.display_status

    @admin.display(description="error")
    def short_error(self, obj: PipelineRun) -> str:
        return _short(obj.error)

    @admin.display(description="procrastinate")
    def jobs(self, obj: PipelineRun) -> str:
        return jobs_link(stage_key(stage=Stage(obj.stage), anfrage=obj.anfrage))


@admin.register(Position)
class PositionAdmin(ReadOnlyModelAdmin):
    list_display = ["anfrage", *POSITION_FIELDS]
    list_filter = ["feasible", "unit", "tenant"]
    list_select_related = ["anfrage"]
    search_fields = ["anfrage__id__exact", "item", "material"]


@admin.register(AnfrageFile)
class AnfrageFileAdmin(ReadOnlyModelAdmin):
    list_display = [
        "id",
        "anfrage",
        "tenant",
        "filename",
        "format",
        "size",
        "short_sha256",
        "created_at",
    ]
    list_filter = ["format", "tenant"]
    list_select_related = ["anfrage", "tenant"]
    search_fields = ["anfrage__id__exact", "filename", "sha256", "storage_key"]
    date_hierarchy = "created_at"

    @admin.display(description="sha256", ordering="sha256")
    def short_sha256(self, obj: AnfrageFile) -> str:
        # The whole digest is on the file's page; 12 hex digits tell files apart here.
        return format_html('<span title="{}">{}…</span>', obj.sha256, obj.sha256[:12])


@admin.register(ExtractionWarning)
class ExtractionWarningAdmin(ReadOnlyModelAdmin):
    list_display = ["anfrage", "line_no", "message", "line"]
    list_filter = ["tenant"]
    list_select_related = ["anfrage"]
    search_fields = ["anfrage__id__exact", "message", "line"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyModelAdmin):
    list_display = ["id", "created_at", "tenant", "action", "entity_type", "entity_id", "actor"]
    list_filter = ["action", "entity_type", "tenant"]
    list_select_related = ["tenant"]
    search_fields = ["entity_id__exact", "actor"]
    date_hierarchy = "created_at"


class CatalogItemInline(admin.StackedInline):
    model = CatalogItem
    extra = 0


@admin.register(Catalog)
class CatalogAdmin(ActionPermissionsMixin, admin.ModelAdmin):
    """A tenant's catalog is its configuration: operators edit it here. The ``validity``
    column validates it as the feasibility and calculate stages will read it."""

    list_display = ["name", "tenant", "currency", "updated_at", "validity"]
    list_select_related = ["tenant"]
    search_fields = ["name", "tenant__slug"]
    readonly_fields = ["validity"]
    inlines = [CatalogItemInline]

    @admin.display(description="validity")
    def validity(self, obj: Catalog) -> str:
        if obj.pk is None:
            return ""
        try:
            spec = catalog_for(tenant_id=obj.tenant_id)
        except PipelineError as exc:
            return f"invalid: {exc.detail}"
        return f"valid ({len(spec.items)} item(s))"
