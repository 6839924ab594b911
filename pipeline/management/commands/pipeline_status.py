"""Show inquiries and their stages (read-only; safe to run any time, also from cron)."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.validation import TENANT_SLUG_MAX, int_argument, text_argument
from pipeline.exceptions import AnfrageNotFound
from pipeline.selectors import anfrage_detail, anfrage_get_any, anfrage_overview, tenant_by_slug
from queueing.display import format_table

MAX_LIMIT = 10_000


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


class Command(BaseCommand):
    help = "Stage status per inquiry; with --anfrage, its stages, positions and quote."

    def add_arguments(self, parser):
        parser.add_argument(
            "--tenant",
            type=text_argument(max_length=TENANT_SLUG_MAX),
            help="only this tenant's inquiries (slug)",
        )
        parser.add_argument("--anfrage", type=int_argument(), help="one inquiry in detail")
        parser.add_argument(
            "--limit",
            type=int_argument(maximum=MAX_LIMIT),
            default=50,
            help=f"newest N inquiries (50, at most {MAX_LIMIT})",
        )

    def handle(self, *args, tenant: str | None, anfrage: int | None, limit: int, **options):
        tenant_id = None
        if tenant is not None:
            tenant_row = tenant_by_slug(slug=tenant)
            if tenant_row is None:
                raise CommandError(f"no tenant {tenant!r}; list tenants in the admin")
            tenant_id = tenant_row.id
        if anfrage is None:
            self._overview(tenant_id, limit)
            return
        try:
            row = anfrage_get_any(anfrage_id=anfrage)
        except AnfrageNotFound as exc:
            raise CommandError(f"{exc.detail}; run without --anfrage to list inquiries") from exc
        if tenant_id is not None and row.tenant_id != tenant_id:
            raise CommandError(f"inquiry {anfrage} belongs to another tenant than {tenant!r}")
        self._detail(row)

    def _overview(self, tenant_id: int | None, limit: int) -> None:
        rows = []
        for anfrage, stages in anfrage_overview(tenant_id=tenant_id, limit=limit):
            rows.append(
                (
                    anfrage.id,
                    anfrage.tenant.slug,
                    _short(anfrage.title, 30),
                    *(s.display for s in stages),
                    anfrage.quote_total,
                )
            )
        header = ("id", "tenant", "title", "intake", "extract", "feasibility", "calculate", "total")
        self.stdout.write(format_table(header, rows))

    def _detail(self, anfrage) -> None:
        detail = anfrage_detail(anfrage=anfrage)
        self.stdout.write(f"inquiry {anfrage.id} ({anfrage.tenant.slug}): {anfrage.title}")
        stage_rows = [
            (
                s.stage,
                s.display,
                s.attempts,
                s.resumes,
                s.started_at and f"{s.started_at:%Y-%m-%d %H:%M:%S}",
                s.finished_at and f"{s.finished_at:%Y-%m-%d %H:%M:%S}",
                _short(s.error),
            )
            for s in detail.stages
        ]
        self.stdout.write(
            format_table(
                ("stage", "status", "attempts", "resumes", "started", "finished", "error"),
                stage_rows,
            )
        )
        self.stdout.write("")
        position_rows = [
            (
                p.position_index,
                f"{p.quantity.normalize():f}",
                p.unit,
                _short(p.item, 40),
                p.material_shown,
                p.length_mm,
                {True: "yes", False: "no", None: ""}[p.feasible],
                _short(p.reason, 50),
                p.unit_price,
                p.total,
            )
            for p in detail.positions
        ]
        self.stdout.write(
            format_table(
                (
                    "#",
                    "qty",
                    "unit",
                    "item",
                    "material",
                    "length_mm",
                    "feasible",
                    "reason",
                    "unit_price",
                    "total",
                ),
                position_rows,
            )
        )
        if detail.warnings:
            self.stdout.write("")
            self.stdout.write(
                format_table(
                    ("line", "warning", "text"),
                    [(w.line_no, w.message, _short(w.line, 50)) for w in detail.warnings],
                )
            )
        given_up = [s.stage for s in detail.stages if s.gave_up]
        if given_up:
            self.stdout.write(
                f"the resume sweep gave up on {', '.join(given_up)}: replay it with "
                f"'manage.py replay_stage --tenant {anfrage.tenant.slug} --anfrage {anfrage.id} "
                f"--stage {given_up[0]}'"
            )
        total = detail.quote_total
        self.stdout.write("")
        self.stdout.write(
            f"quote total: {total} {detail.currency}"
            if total is not None
            else "quote total: not calculated yet"
        )
