"""Admin for inquiries, stage runs, positions, files, warnings, catalogs and the audit log.

Pipeline rows are written by the stages only, so they are read-only here; the replay
actions call the same service as ``manage.py replay_stage`` and need the change
permission on stage runs. The forced replay first shows a confirmation page with what it
will reset, and reports how many stages it reset; refusals say which action lifts them.
A stage a replay reset or queued shows as ``waiting (replay)``; one the resume sweep gave
up on as ``failed (gave up)`` (filter runs by *resume sweep*), and replaying it gives it
a fresh resume budget. Catalogs are the tenants' configuration and stay editable.
Inquiries and runs link procrastinate's jobs of their stage keys (``stage:tenant:anfrage``).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.db.models import Prefetch
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.text import Truncator

from pipeline.exceptions import PipelineError, ReplayRefused
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
from queueing.admin import ReadOnlyModelAdmin, jobs_link

#: How many refusal reasons one message lists (the rest are counted).
MAX_REASONS = 5
#: How much of a run's error the runs list shows (the rest is in the tooltip).
ERROR_CHARS = 40


def _short(text: str, chars: int = 80) -> str:
    return Truncator(text).chars(chars)


#: A position's columns as operators read them (inline on the inquiry and in the list).
POSITION_FIELDS = [
    "position_index",
    "quantity",
    "unit",
    "item",
    "material_shown",
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


#: What lifts a refusal, in the admin's terms (``ReplayRefused.remedy``).
REMEDIES = {
    "force": " (use “Force replay stage and the stages after it”)",
    "cascade": " (use “Force replay stage and the stages after it”)",
}


def _refusal(exc: PipelineError) -> str:
    remedy = exc.remedy if isinstance(exc, ReplayRefused) else ""
    return f"{exc.detail}{REMEDIES.get(remedy, '')}"


def _replay_targets(queryset, *, cascade: bool) -> list[PipelineRun]:
    """The selected runs in inquiry and stage order; with ``cascade``, one per inquiry
    (its earliest selected stage: the replay covers the stages after it)."""
    runs = sorted(queryset, key=lambda r: (r.anfrage_id, Stage.values.index(r.stage)))
    if not cascade:
        return runs
    first: dict[int, PipelineRun] = {}
    for run in runs:
        first.setdefault(run.anfrage_id, run)
    return list(first.values())


@dataclass(frozen=True, kw_only=True)
class PlannedReplay:
    """One row of the confirmation page: what a replay would reset, or why it is refused."""

    run: PipelineRun
    resets: tuple[str, ...] = ()
    refused: str = ""


def _plan(targets: list[PipelineRun], *, force: bool, cascade: bool) -> list[PlannedReplay]:
    plans = []
    for run in targets:
        try:
            result = pipeline_stage_replay(
                tenant_id=run.tenant_id,
                anfrage_id=run.anfrage_id,
                stage=run.stage,
                force=force,
                cascade=cascade,
                dry_run=True,
                actor="admin:plan",
            )
        except PipelineError as exc:
            plans.append(PlannedReplay(run=run, refused=_refusal(exc)))
        else:
            plans.append(PlannedReplay(run=run, resets=result.reopened))
    return plans


def _replay(modeladmin, request, queryset, *, force: bool, cascade: bool) -> None:
    actor = f"admin:{request.user.get_username()}"
    queued: list[str] = []
    waiting: list[str] = []
    reset = 0
    refused: list[str] = []
    for run in _replay_targets(queryset, cascade=cascade):
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
            refused.append(f"#{run.anfrage_id} {run.stage}: {_refusal(exc)}")
            continue
        reset += len(result.reopened)
        what = f"#{run.anfrage_id} {run.stage}" + (
            f" (reset {', '.join(result.reopened)})" if result.reopened else ""
        )
        (queued if result.enqueued else waiting).append(what)
    if queued:
        modeladmin.message_user(
            request,
            f"{len(queued)} replay(s) queued, {reset} stage(s) reset to run again: "
            + "; ".join(queued),
            messages.SUCCESS,
        )
    if waiting:
        modeladmin.message_user(
            request,
            f"{len(waiting)} replay(s) found a job of the stage waiting or running; no second "
            "job was queued (the replay is audited and reset what had succeeded): "
            + "; ".join(waiting),
            messages.INFO,
        )
    if refused:
        more = len(refused) - MAX_REASONS
        modeladmin.message_user(
            request,
            f"{len(refused)} replay(s) refused: "
            + "; ".join(refused[:MAX_REASONS])
            + (f"; and {more} more" if more > 0 else ""),
            messages.WARNING,
        )


@admin.action(description="Replay stage (failed or abandoned runs)", permissions=["operate"])
def replay_stage(modeladmin, request, queryset) -> None:
    _replay(modeladmin, request, queryset, force=False, cascade=False)


@admin.action(description="Force replay stage and the stages after it", permissions=["operate"])
def force_replay_cascade(modeladmin, request, queryset) -> TemplateResponse | None:
    """First a confirmation page that lists, per inquiry, the stages the replay resets
    (from a dry run) and the refusals; the replay runs when the operator confirms."""
    if request.POST.get("confirmed") == "yes":
        _replay(modeladmin, request, queryset, force=True, cascade=True)
        return None
    targets = _replay_targets(queryset, cascade=True)
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Force replay: confirm what is reset",
        "opts": modeladmin.model._meta,
        "plans": _plan(targets, force=True, cascade=True),
        "selected": [run.pk for run in queryset],
        "action": "force_replay_cascade",
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/pipeline/pipelinerun/replay_confirmation.html", context)


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
    # Narrow columns, so the list fits a 1400 px window beside its filters: the inquiry
    # by number (its title in the tooltip), attempts and resumes in one column, the last
    # time the run moved, and the error cut short (whole in the tooltip and on its page).
    list_display = [
        "id",
        "inquiry",
        "tenant",
        "stage",
        "display_status",
        "tries",
        "last_moved",
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

    @admin.display(description="inquiry", ordering="anfrage_id")
    def inquiry(self, obj: PipelineRun) -> str:
        return format_html('<span title="{}">#{}</span>', obj.anfrage.title, obj.anfrage_id)

    @admin.display(description="attempts / resumes")
    def tries(self, obj: PipelineRun) -> str:
        return f"{obj.attempts} / {obj.resumes}"

    @admin.display(description="finished (or started)", ordering="finished_at")
    def last_moved(self, obj: PipelineRun) -> str:
        moved = obj.finished_at or obj.started_at
        return f"{timezone.localtime(moved):%Y-%m-%d %H:%M}" if moved else ""

    @admin.display(description="error")
    def short_error(self, obj: PipelineRun) -> str:
        return format_html('<span title="{}">{}</span>', obj.error, _short(obj.error, ERROR_CHARS))

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
class CatalogAdmin(admin.ModelAdmin):
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
