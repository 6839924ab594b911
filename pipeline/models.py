"""Inquiries (Anfragen), their stage ledger, files, positions, warnings, catalogs and the
audit log (docs/design.md#pipeline). Models hold fields and constraints; services hold the
writes."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from accounts.models import Tenant
from queueing.ledger import LedgerEntry, LedgerStatus


class Stage(models.TextChoices):
    """The stages, in the order they run."""

    INTAKE = "intake"
    EXTRACT = "extract"
    FEASIBILITY = "feasibility"
    CALCULATE = "calculate"

    @property
    def next(self) -> Stage | None:
        order = list(Stage)
        index = order.index(self)
        return order[index + 1] if index + 1 < len(order) else None

    @property
    def previous(self) -> tuple[Stage, ...]:
        order = list(Stage)
        return tuple(order[: order.index(self)])

    @property
    def following(self) -> tuple[Stage, ...]:
        order = list(Stage)
        return tuple(order[order.index(self) + 1 :])


class FileFormat(models.TextChoices):
    TEXT = "text"
    CSV = "csv"
    MARKDOWN = "markdown"


class Unit(models.TextChoices):
    """Canonical units: extraction converts mm/cm to m and t to kg."""

    PIECES = "pcs"
    METRES = "m"
    KILOGRAMS = "kg"


class Anfrage(models.Model):
    """An inquiry of a tenant. ``uploads`` is the manifest fixed at submit time (name,
    sha256, size, format per file); intake turns it into ``AnfrageFile`` rows.

    ``completed_at`` is set when every stage succeeded (by calculate's closing
    transaction, or by the resume sweep after a replay without ``--cascade``) and cleared
    when a stage's output invalidates the quote or a replay reopens the inquiry. The
    inquiries where it is NULL are the ones in flight: the resume sweep reads only those
    (a partial index), so its cost follows the work in flight, not the history."""

    # Indexed by anfragen_tenant_created_idx (tenant first), not by a redundant FK index.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="anfragen", db_index=False
    )
    title = models.CharField(max_length=200, blank=True, default="")
    uploads = models.JSONField(default=list, blank=True)
    quote_total = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True, default="")
    created_at = models.DateTimeField(db_default=Now())
    completed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "anfragen"
        ordering = ["-id"]
        verbose_name = "inquiry"
        verbose_name_plural = "inquiries"
        indexes = [
            models.Index(fields=["tenant", "-id"], name="anfragen_tenant_id_idx"),
            models.Index(
                fields=["id"], name="anfragen_open_idx", condition=models.Q(completed_at=None)
            ),
            # The hourly bound per tenant reads its last hour of inquiries.
            models.Index(fields=["tenant", "created_at"], name="anfragen_tenant_created_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}".strip()


class PipelineRun(LedgerEntry):
    """The stage ledger: at most one row per (tenant, anfrage, stage), claimed by
    ``queueing.ledger.Ledger``. Only the ledger columns may be NOT NULL without a
    database default: the claim is a raw ``INSERT``.

    ``resumes`` counts how often the resume sweep re-enqueued the stage since the last
    replay; ``gave_up_at`` is set when it stopped doing so (the row is then ``failed``
    with the reason, and waits for an operator's replay, which clears both)."""

    # Indexed by pipeline_runs_tenant_anfrage_stage_uq (tenant first), not by a redundant FK index.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    anfrage = models.ForeignKey(Anfrage, on_delete=models.CASCADE, related_name="runs")
    stage = models.CharField(max_length=16, choices=Stage.choices)
    resumes = models.PositiveIntegerField(db_default=0)
    gave_up_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pipeline_runs"
        ordering = ["anfrage_id", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "anfrage", "stage"], name="pipeline_runs_tenant_anfrage_stage_uq"
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=LedgerStatus.values),
                name="pipeline_runs_status_valid",
            ),
        ]
        indexes = [
            models.Index(fields=["stage", "status"], name="pipeline_runs_stage_status_idx"),
            # /metrics counts the running stages on every scrape: only they are indexed.
            models.Index(
                fields=["stage"],
                condition=models.Q(status="running"),
                name="pipeline_runs_running_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.stage} of #{self.anfrage_id}: {self.display_status}"

    @property
    def display_status(self) -> str:
        """The status as operators read it (:func:`display_status`)."""
        return display_status(status=self.status, error=self.error, gave_up=self.gave_up_at)


class AnfrageFile(models.Model):
    """A stored file. ``storage_key`` names tenant, inquiry and content, so the same bytes
    sent twice to one inquiry are one row, and to two inquiries two rows."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    anfrage = models.ForeignKey(Anfrage, on_delete=models.CASCADE, related_name="files")
    sha256 = models.CharField(max_length=64)
    storage_key = models.CharField(max_length=300)
    size = models.PositiveBigIntegerField()
    filename = models.CharField(max_length=255)
    format = models.CharField(max_length=16, choices=FileFormat.choices)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "anfrage_files"
        ordering = ["id"]
        verbose_name = "inquiry file"
        constraints = [
            models.UniqueConstraint(
                fields=["sha256", "storage_key"], name="anfrage_files_sha256_storage_key_uq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.filename} ({self.sha256[:12]})"


class Position(models.Model):
    """A requested item parsed from a file; feasibility and calculate fill the rest."""

    # Indexed by anfrage_positions_tenant_anfrage_index_uq (tenant first), not by an FK index.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    anfrage = models.ForeignKey(Anfrage, on_delete=models.CASCADE, related_name="positions")
    position_index = models.PositiveIntegerField()
    source_file = models.ForeignKey(
        AnfrageFile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source_line = models.PositiveIntegerField()
    label = models.CharField(max_length=32, blank=True, default="")
    raw = models.TextField()
    quantity = models.DecimalField(max_digits=15, decimal_places=3)
    unit = models.CharField(max_length=8, choices=Unit.choices)
    item = models.CharField(max_length=300)
    material = models.CharField(max_length=64, blank=True, default="")
    length_mm = models.PositiveIntegerField(null=True, blank=True)
    catalog_item = models.CharField(max_length=64, blank=True, default="")
    catalog_material = models.CharField(max_length=64, blank=True, default="")
    feasible = models.BooleanField(null=True, blank=True)
    reason = models.CharField(max_length=300, blank=True, default="")
    unit_price = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)
    total = models.DecimalField(max_digits=14, decimal_places=2, null=True, blank=True)

    class Meta:
        db_table = "anfrage_positions"
        ordering = ["anfrage_id", "position_index"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "anfrage", "position_index"],
                name="anfrage_positions_tenant_anfrage_index_uq",
            )
        ]

    def __str__(self) -> str:
        return f"#{self.anfrage_id}.{self.position_index} {self.quantity} {self.unit} {self.item}"

    @property
    def material_assumed(self) -> bool:
        """Feasibility chose the material: the inquiry named none."""
        return bool(self.catalog_material) and not self.material

    @property
    def material_shown(self) -> str:
        """The one material every view shows (dashboard, API, ``pipeline_status``, admin):
        the catalog's, which the price is for, once feasibility chose it — ``S235
        (assumed)`` when the inquiry named none, ``S235 (steel)`` when it named it in other
        words; before that (or when no catalog item matched) the inquiry's own word."""
        code = self.catalog_material
        if not code:
            return self.material
        if self.material_assumed:
            return f"{code} (assumed)"
        if "".join(self.material.split()).lower() != "".join(code.split()).lower():
            return f"{code} ({self.material})"
        return code


class ExtractionWarning(models.Model):
    """A line extract could not read; replaced together with the positions."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    anfrage = models.ForeignKey(Anfrage, on_delete=models.CASCADE, related_name="warnings")
    source_file = models.ForeignKey(
        AnfrageFile, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    line_no = models.PositiveIntegerField()
    line = models.TextField()
    message = models.CharField(max_length=300)

    class Meta:
        db_table = "anfrage_warnings"
        ordering = ["anfrage_id", "id"]

    def __str__(self) -> str:
        return f"#{self.anfrage_id} line {self.line_no}: {self.message}"


class AuditEntry(models.Model):
    """Append-only: who did what to which row. ``entity_id`` names a row that exists
    (a file entry names the row intake inserted or found in the table, never a guess)."""

    # Indexed by audit_log_tenant_idx (tenant first), not by a redundant FK index.
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+", db_index=False)
    entity_type = models.CharField(max_length=32)
    entity_id = models.BigIntegerField()
    action = models.CharField(max_length=64)
    actor = models.CharField(max_length=150)
    payload = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "audit_log"
        ordering = ["-id"]
        verbose_name = "audit entry"
        verbose_name_plural = "audit log"
        indexes = [
            models.Index(fields=["entity_type", "entity_id"], name="audit_log_entity_idx"),
            models.Index(fields=["tenant", "-id"], name="audit_log_tenant_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.entity_type}#{self.entity_id} by {self.actor}"


class Catalog(models.Model):
    """A tenant's own catalog; tenants without one use the default shipped as data
    (``pipeline/data/default_catalog.json``). ``materials`` maps a material code to its
    aliases, e.g. ``{"S235": ["steel", "St37"]}``."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="catalog")
    name = models.CharField(max_length=200)
    currency = models.CharField(max_length=3, default="EUR")
    materials = models.JSONField(default=dict, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        db_table = "catalogs"

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"


class CatalogItem(models.Model):
    """What a tenant makes: matched by keywords, limited by materials, length and a
    minimum quantity, priced per ``unit`` with quantity breaks
    (``price_breaks = [[min_quantity, unit_price], ...]``, decimals as strings)."""

    # Indexed by catalog_items_code_uq (catalog first), not by a redundant FK index.
    catalog = models.ForeignKey(
        Catalog, on_delete=models.CASCADE, related_name="items", db_index=False
    )
    code = models.SlugField(max_length=64)
    name = models.CharField(max_length=200)
    keywords = models.JSONField(default=list)
    materials = models.JSONField(default=list)
    unit = models.CharField(max_length=8, choices=Unit.choices)
    max_length_mm = models.PositiveIntegerField(null=True, blank=True)
    min_quantity = models.DecimalField(max_digits=15, decimal_places=3, default=1)
    price_breaks = models.JSONField(default=list)
    sort_order = models.PositiveIntegerField(default=0)

    class Meta:
        db_table = "catalog_items"
        ordering = ["catalog_id", "sort_order", "id"]
        constraints = [
            models.UniqueConstraint(fields=["catalog", "code"], name="catalog_items_code_uq")
        ]

    def __str__(self) -> str:
        return f"{self.code} ({self.catalog})"


#: How a replay's reason begins (``pipeline_runs.error``): a stage a replay reset or
#: queued, that has not run since (its next claim clears ``error``).
REPLAY_REASON_PREFIX = "replay requested by"
#: The status shown for such a stage: it waits for the replay's job, it did not fail.
WAITING_FOR_REPLAY = "waiting (replay)"


def display_status(*, status: str, error: str, gave_up: object) -> str:
    """A ledger status as operators read it: a stage a replay reset or queued is
    *waiting (replay)*, a failed stage the resume sweep gave up on says so."""
    if status == LedgerStatus.FAILED and error.startswith(REPLAY_REASON_PREFIX):
        return WAITING_FOR_REPLAY
    if status == LedgerStatus.FAILED and gave_up is not None:
        return "failed (gave up)"
    return status
