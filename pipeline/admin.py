"""Admin for inquiries, runs, positions, files, catalogs and the (read-only) audit log.

Pipeline rows are written by the stages only, so they are read-only here; the "replay"
actions call the same service as ``manage.py replay_stage``.
"""

from __future__ import annotations

from django.contrib import admin, messages

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
)
from pipeline.services import pipeline_stage_replay


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class PositionInline(admin.TabularInline):
    model = Position
    fields = [
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
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


class RunInline(admin.TabularInline):
    model = PipelineRun
    fields = ["stage", "status", "attempts", "started_at", "finished_at", "error"]
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Anfrage)
class AnfrageAdmin(ReadOnlyAdmin):
    list_display = ["id", "tenant", "title", "quote_total", "currency", "created_at"]
    list_filter = ["tenant"]
    search_fields = ["title"]
    inlines = [RunInline, PositionInline]


def _replay(modeladmin, request, queryset, *, force: bool, cascade: bool) -> None:
    done = refused = 0
    for run in queryset.order_by("id"):
        try:
            pipeline_stage_replay(
                tenant_id=run.tenant_id,
                anfrage_id=run.anfrage_id,
                stage=run.stage,
                force=force,
                cascade=cascade,
                actor=f"admin:{request.user.username}",
            )
        except PipelineError as exc:
            refused += 1
            modeladmin.message_user(
                request, f"#{run.anfrage_id} {run.stage}: {exc.detail}", messages.WARNING
            )
        else:
            done += 1
    if done:
        modeladmin.message_user(request, f"{done} stage(s) queued for replay", messages.SUCCESS)


@admin.action(description="Replay stage (failed or abandoned runs)")
def replay_stage(modeladmin, request, queryset) -> None:
    _replay(modeladmin, request, queryset, force=False, cascade=False)


@admin.action(description="Force replay stage and the stages after it")
def force_replay_cascade(modeladmin, request, queryset) -> None:
    _replay(modeladmin, request, queryset, force=True, cascade=True)


@admin.register(PipelineRun)
class PipelineRunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "anfrage",
        "tenant",
        "stage",
        "status",
        "attempts",
        "started_at",
        "finished_at",
        "error",
    ]
    list_filter = ["stage", "status", "tenant"]
    search_fields = ["anfrage__id", "error"]
    actions = [replay_stage, force_replay_cascade]


@admin.register(Position)
class PositionAdmin(ReadOnlyAdmin):
    list_display = [
        "anfrage",
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
    list_filter = ["feasible", "unit", "tenant"]
    search_fields = ["item", "anfrage__id"]


@admin.register(AnfrageFile)
class AnfrageFileAdmin(ReadOnlyAdmin):
    list_display = ["id", "anfrage", "tenant", "filename", "format", "size", "sha256", "created_at"]
    list_filter = ["format", "tenant"]
    search_fields = ["filename", "sha256", "storage_key"]


@admin.register(ExtractionWarning)
class ExtractionWarningAdmin(ReadOnlyAdmin):
    list_display = ["anfrage", "line_no", "message", "line"]
    list_filter = ["tenant"]


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ["id", "created_at", "tenant", "action", "entity_type", "entity_id", "actor"]
    list_filter = ["action", "entity_type", "tenant"]
    search_fields = ["entity_id", "actor"]


class CatalogItemInline(admin.StackedInline):
    model = CatalogItem
    extra = 0


@admin.register(Catalog)
class CatalogAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "currency", "updated_at"]
    inlines = [CatalogItemInline]
