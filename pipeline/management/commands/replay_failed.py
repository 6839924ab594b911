"""Replay every failed (or abandoned) run of one stage. Safe to re-run, also from cron:
a stage already queued is joined, not queued twice."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.validation import TENANT_SLUG_MAX, int_argument, text_argument
from pipeline.exceptions import PipelineError
from pipeline.models import Stage
from pipeline.replay import pipeline_stage_replay
from pipeline.selectors import parse_stage, replayable_runs, tenant_by_slug
from queueing.display import format_table, progress


class Command(BaseCommand):
    help = "Replay the failed runs of --stage (optionally of one --tenant), with a progress bar."

    def add_arguments(self, parser):
        parser.add_argument(
            "--stage",
            required=True,
            type=text_argument(max_length=32),
            help=f"one of {', '.join(Stage.values)}",
        )
        parser.add_argument(
            "--tenant", type=text_argument(max_length=TENANT_SLUG_MAX), help="only this tenant"
        )
        parser.add_argument("--dry-run", action="store_true", help="list them, change nothing")
        parser.add_argument(
            "--limit",
            type=int_argument(maximum=100_000),
            default=10_000,
            help="at most N runs (10,000; at most 100,000)",
        )

    def handle(self, *args, stage: str, tenant: str | None, dry_run: bool, limit: int, **options):
        try:
            stage_value = parse_stage(stage)
        except PipelineError as exc:
            raise CommandError(str(exc.detail)) from exc
        tenant_id = None
        if tenant is not None:
            tenant_row = tenant_by_slug(slug=tenant)
            if tenant_row is None:
                raise CommandError(f"no tenant {tenant!r}; check the slug in the admin")
            tenant_id = tenant_row.id
        targets = replayable_runs(stage=stage_value, tenant_id=tenant_id, limit=limit)
        rows = []
        counts = {"enqueued": 0, "already queued": 0, "refused": 0, "would enqueue": 0}
        for target_tenant, anfrage_id in progress(
            targets, label=f"replay {stage_value.value}", stream=self.stderr
        ):
            try:
                result = pipeline_stage_replay(
                    tenant_id=target_tenant,
                    anfrage_id=anfrage_id,
                    stage=stage_value,
                    dry_run=dry_run,
                    actor="command:replay_failed",
                )
            except PipelineError as exc:
                outcome, detail = "refused", str(exc.detail)
            else:
                if result.dry_run:
                    outcome, detail = "would enqueue", ""
                else:
                    outcome = "enqueued" if result.enqueued else "already queued"
                    detail = f"job {result.job_id}"
            counts[outcome] += 1
            rows.append((anfrage_id, outcome, detail))
        self.stdout.write(format_table(("anfrage", "outcome", "detail"), rows))
        summary = ", ".join(f"{n} {name}" for name, n in counts.items() if n)
        self.stdout.write(
            f"{len(targets)} failed {stage_value.value} run(s): {summary or 'nothing to do'}"
            + (" (dry run: nothing changed)" if dry_run else "")
        )
