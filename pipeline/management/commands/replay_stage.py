"""Run one stage of an inquiry again (audited). Not for cron: an operator's decision.

Examples::

    manage.py replay_stage --tenant acme --anfrage 42 --stage extract            # failed stage
    manage.py replay_stage --tenant acme --anfrage 42 --stage extract --force --cascade
    manage.py replay_stage --tenant acme --anfrage 42 --stage calculate --force --dry-run
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from accounts.validation import TENANT_SLUG_MAX, int_argument, text_argument
from pipeline.exceptions import PipelineError, ReplayRefused
from pipeline.models import Stage
from pipeline.replay import pipeline_stage_replay
from pipeline.selectors import parse_stage, tenant_by_slug
from queueing.display import format_table

#: How this command's flags lift a refusal (``ReplayRefused.remedy``).
REMEDIES = {
    "force": " (pass --force)",
    "cascade": " (add --cascade to run them again too)",
}


class Command(BaseCommand):
    help = "Replay a stage of an inquiry: --force for a successful stage, --cascade for the rest."

    def add_arguments(self, parser):
        parser.add_argument(
            "--tenant",
            required=True,
            type=text_argument(max_length=TENANT_SLUG_MAX),
            help="tenant slug",
        )
        parser.add_argument("--anfrage", required=True, type=int_argument(), help="inquiry id")
        parser.add_argument(
            "--stage",
            required=True,
            type=text_argument(max_length=32),
            help=f"one of {', '.join(Stage.values)}",
        )
        parser.add_argument("--force", action="store_true", help="replay a successful stage")
        parser.add_argument(
            "--cascade", action="store_true", help="re-run the stages after it as well"
        )
        parser.add_argument("--dry-run", action="store_true", help="show, change nothing")

    def handle(
        self,
        *args,
        tenant: str,
        anfrage: int,
        stage: str,
        force: bool,
        cascade: bool,
        dry_run: bool,
        **options,
    ):
        tenant_row = tenant_by_slug(slug=tenant)
        if tenant_row is None:
            raise CommandError(f"no tenant {tenant!r}; check the slug in the admin")
        try:
            stage_value = parse_stage(stage)
            result = pipeline_stage_replay(
                tenant_id=tenant_row.id,
                anfrage_id=anfrage,
                stage=stage_value,
                force=force,
                cascade=cascade,
                dry_run=dry_run,
                actor="command:replay_stage",
            )
        except ReplayRefused as exc:
            raise CommandError(f"{exc.detail}{REMEDIES.get(exc.remedy, '')}") from exc
        except PipelineError as exc:
            raise CommandError(str(exc.detail)) from exc
        if result.dry_run:
            job = "would enqueue"
        else:
            job = f"{'enqueued' if result.enqueued else 'already queued'} job {result.job_id}"
        self.stdout.write(
            format_table(
                ("anfrage", "stage", "reopened", "job"),
                [(result.anfrage_id, result.stage.value, ", ".join(result.reopened) or "-", job)],
            )
        )
        if result.dry_run:
            self.stdout.write("dry run: nothing changed")
