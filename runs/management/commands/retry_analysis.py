"""Retry one failed analysis: its document is admitted again as a new job of the same
run (charged one credit; the failed job was refunded), audited. Safe to repeat: a job
is retried once, a repeat names the job the first retry made. A job a later job of its
run superseded is refused. The output (``--dry-run`` too) names the result the retry
replaces in the user's run once it finishes."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from queueing.display import format_table
from runs.api import MAX_ID
from runs.exceptions import RunsError
from runs.operations import RetryOutcome, analysis_job_retry

ACTOR = "command:retry_analysis"


class Command(BaseCommand):
    help = "Retry a failed analysis job as a new job of the same run (audited)."

    def add_arguments(self, parser):
        parser.add_argument("--job", required=True, type=int, help="the failed job's id")
        parser.add_argument("--dry-run", action="store_true", help="check only, change nothing")

    def handle(self, *args, job: int, dry_run: bool, **options):
        if not 1 <= job <= MAX_ID:
            raise CommandError(f"--job {job} is not a job id (1 or more)")
        try:
            retried = analysis_job_retry(job_id=job, actor=ACTOR, dry_run=dry_run)
        except RunsError as exc:
            raise CommandError(f"job {job} was not retried: {exc}") from exc
        self.stdout.write(
            format_table(
                ["job", "outcome", "new job", "status", "queue position", "replaces"],
                [
                    [
                        retried.job_id,
                        retried.outcome.value.replace("_", " "),
                        retried.new_job_id if retried.new_job_id is not None else "-",
                        retried.status or "-",
                        retried.queue_position,
                        retried.replaces or "-",
                    ]
                ],
            )
        )
        if retried.outcome is RetryOutcome.WOULD_RETRY:
            self.stdout.write("dry run: nothing changed")
