"""Reads of the pipeline: inquiries scoped to a tenant, their status, catalogs."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

from django.db import connection

from accounts.models import Tenant
from pipeline.catalog import CatalogSpec, catalog_from_dict, default_catalog
from pipeline.exceptions import AnfrageNotFound, UnknownStage
from pipeline.models import (
    WAITING_FOR_REPLAY,
    Anfrage,
    AnfrageFile,
    Catalog,
    ExtractionWarning,
    PipelineRun,
    Position,
    Stage,
    display_status,
)
from pipeline.queries import QUERIES

#: Shown for a stage that has no ledger row yet (it is not a ledger status).
PENDING = "pending"
#: Shown on the dashboard for a stage waiting for a replay's run (StageStatus.shown).
WAITING = "waiting"


@dataclass(frozen=True, kw_only=True)
class StageStatus:
    stage: str
    status: str
    attempts: int = 0
    error: str = ""
    started_at: datetime.datetime | None = None
    finished_at: datetime.datetime | None = None
    #: How often the resume sweep re-enqueued it since the last replay.
    resumes: int = 0
    #: The resume sweep gave up on it: it waits for an operator's replay.
    gave_up: bool = False

    @property
    def display(self) -> str:
        """The status as operators read it (waiting for a replay, or given up on)."""
        return display_status(status=self.status, error=self.error, gave_up=self.gave_up or None)

    @property
    def waiting(self) -> bool:
        """Reset or queued by a replay and not run since (``failed`` in the ledger)."""
        return self.display == WAITING_FOR_REPLAY

    @property
    def shown(self) -> str:
        """The status the dashboard shows: ``waiting`` for such a stage, else the ledger's."""
        return WAITING if self.waiting else self.status


@dataclass(frozen=True, kw_only=True)
class AnfrageDetail:
    """``quote_total`` and ``currency`` are read in the statement that reads the stages:
    a ``calculate`` shown as ``success`` always comes with its quote."""

    anfrage: Anfrage
    stages: tuple[StageStatus, ...]
    files: tuple[AnfrageFile, ...]
    positions: tuple[Position, ...]
    warnings: tuple[ExtractionWarning, ...]
    quote_total: Decimal | None
    currency: str

    @property
    def complete(self) -> bool:
        return all(s.status == "success" for s in self.stages)


def parse_stage(value: str | Stage) -> Stage:
    """``value`` as a Stage, or :class:`UnknownStage` naming the valid ones."""
    try:
        return Stage(value)
    except ValueError:
        raise UnknownStage(
            f"unknown stage {value!r}; the stages are {', '.join(Stage.values)}"
        ) from None


def anfrage_get(*, tenant_id: int, anfrage_id: int) -> Anfrage:
    """The tenant's inquiry; another tenant's id is :class:`AnfrageNotFound` (a 404)."""
    anfrage = (
        Anfrage.objects.select_related("tenant").filter(tenant_id=tenant_id, pk=anfrage_id).first()
    )
    if anfrage is None:
        raise AnfrageNotFound(f"no inquiry {anfrage_id} for this tenant")
    return anfrage


def anfrage_file_get(*, tenant_id: int, anfrage_id: int, file_id: int) -> AnfrageFile:
    """A stored file of the tenant's inquiry; :class:`AnfrageNotFound` for a missing or
    foreign inquiry or a file of another inquiry."""
    stored = AnfrageFile.objects.filter(
        pk=file_id, anfrage_id=anfrage_id, tenant_id=tenant_id
    ).first()
    if stored is None:
        raise AnfrageNotFound(f"no file {file_id} in inquiry {anfrage_id}")
    return stored


def anfrage_get_any(*, anfrage_id: int) -> Anfrage:
    """Any tenant's inquiry, for operators (commands and admin), never for the API."""
    anfrage = Anfrage.objects.select_related("tenant").filter(pk=anfrage_id).first()
    if anfrage is None:
        raise AnfrageNotFound(f"no inquiry {anfrage_id}")
    return anfrage


def tenant_by_slug(*, slug: str) -> Tenant | None:
    return Tenant.objects.filter(slug=slug).first()


def stage_statuses(runs: list[PipelineRun]) -> tuple[StageStatus, ...]:
    """One status per stage, in order; stages without a ledger row are ``pending``."""
    by_stage = {run.stage: run for run in runs}
    statuses = []
    for stage in Stage:
        run = by_stage.get(stage.value)
        if run is None:
            statuses.append(StageStatus(stage=stage.value, status=PENDING))
        else:
            statuses.append(
                StageStatus(
                    stage=stage.value,
                    status=run.status,
                    attempts=run.attempts,
                    error=run.error,
                    started_at=run.started_at,
                    finished_at=run.finished_at,
                    resumes=run.resumes,
                    gave_up=run.gave_up_at is not None and run.status == "failed",
                )
            )
    return tuple(statuses)


def anfrage_detail(*, anfrage: Anfrage, rows: bool = True) -> AnfrageDetail:
    """Stages, files and (unless ``rows`` is False: the API pages them) every position
    and warning of the inquiry."""
    # One statement for the stages and the quote (one snapshot): read apart, calculate
    # could commit between them, and a page would show it succeeded without a quote.
    runs = list(anfrage.runs.select_related("anfrage"))
    current = runs[0].anfrage if runs else anfrage
    return AnfrageDetail(
        anfrage=anfrage,
        quote_total=current.quote_total,
        currency=current.currency,
        stages=stage_statuses(runs),
        files=tuple(anfrage.files.order_by("id")),
        positions=tuple(anfrage.positions.order_by("position_index")) if rows else (),
        warnings=tuple(anfrage.warnings.order_by("id")) if rows else (),
    )


def anfrage_overview(
    *,
    tenant_id: int | None = None,
    limit: int = 50,
    anfragen: Sequence[Anfrage] | None = None,
) -> list[tuple[Anfrage, tuple[StageStatus, ...]]]:
    """The newest inquiries (optionally of one tenant), or the given ``anfragen`` (a
    page), with their stage statuses."""
    if anfragen is not None:
        rows = list(anfragen)
    else:
        query = Anfrage.objects.select_related("tenant").order_by("-id")
        if tenant_id is not None:
            query = query.filter(tenant_id=tenant_id)
        rows = list(query[:limit])
    runs: dict[int, list[PipelineRun]] = {}
    for run in PipelineRun.objects.filter(anfrage__in=rows).select_related("anfrage"):
        runs.setdefault(run.anfrage_id, []).append(run)
    # Each quote as of the statement that read the stages (see anfrage_detail).
    for anfrage in rows:
        if anfrage.id in runs:
            current = runs[anfrage.id][0].anfrage
            anfrage.quote_total, anfrage.currency = current.quote_total, current.currency
    return [(a, stage_statuses(runs.get(a.id, []))) for a in rows]


def replayable_runs(
    *, stage: Stage, tenant_id: int | None = None, limit: int = 10_000
) -> list[tuple[int, int]]:
    """``(tenant_id, anfrage_id)`` of runs of ``stage`` that failed or were abandoned with
    an expired lease, whose earlier stages succeeded; oldest first."""
    with connection.cursor() as cursor:
        cursor.execute(
            QUERIES["replayable_runs"],
            {
                "stage": stage.value,
                "tenant_id": tenant_id,
                "previous": [s.value for s in stage.previous],
                "limit": limit,
            },
        )
        return [(row[0], row[1]) for row in cursor.fetchall()]


def catalog_for(*, tenant_id: int) -> CatalogSpec:
    """The tenant's own catalog, else the default shipped as data."""
    catalog = Catalog.objects.filter(tenant_id=tenant_id).prefetch_related("items").first()
    if catalog is None:
        return default_catalog()
    return catalog_from_dict(
        {
            "name": catalog.name,
            "currency": catalog.currency,
            "materials": catalog.materials,
            "items": [
                {
                    "code": item.code,
                    "name": item.name,
                    "keywords": item.keywords,
                    "materials": item.materials,
                    "unit": item.unit,
                    "max_length_mm": item.max_length_mm,
                    "min_quantity": str(item.min_quantity),
                    "price_breaks": item.price_breaks,
                }
                for item in catalog.items.all()
            ],
        }
    )
