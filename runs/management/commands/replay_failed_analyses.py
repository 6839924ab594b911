"""Retry every failed analysis (optionally of one user, ended since a time), each as a new
job of its run, audited. Safe to re-run, also from cron: a job is retried once, and a job
a later job of its run superseded is refused (listed with the job that superseded it).
Each row (``--dry-run`` too) names the result the retry replaces in the user's run."""

from __future__ import annotations

import datetime
import re
from collections import Counter

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

from accounts.models import User
from queueing.display import format_table, progress
from runs.exceptions import RunsError
from runs.operations import RetryOutcome, analysis_job_retry
from runs.selectors import retryable_failed_jobs

ACTOR = "command:replay_failed_analyses"
_AGO = re.compile(r"^(?P<n>\d{1,6})(?P<unit>[mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}


def parse_since(value: str, *, now: datetime.datetime) -> datetime.datetime:
    """``2h``/``30m``/``7d`` ago, an ISO date (midnight UTC) or an ISO date and time."""
    text = value.strip()
    if match := _AGO.match(text):
        return now - datetime.timedelta(**{_UNITS[match["unit"]]: int(match["n"])})
    try:
        moment = parse_datetime(text)
        day = None if moment else parse_date(text)
    except ValueError:
        moment = day = None
    if day is not None:
        moment = datetime.datetime.combine(day, datetime.time(), datetime.UTC)
    if moment is None:
        raise CommandError(
            f"--since {value!r}: give an age (30m, 2h, 7d), a date (2025-01-31) or a date "
            "and time (2025-01-31T08:00)"
        )
    if timezone.is_naive(moment):
        moment = timezone.make_aware(moment, datetime.UTC)
    return moment


class Command(BaseCommand):
    help = "Retry the failed analyses (optionally of --user, ended --since), with a progress bar."

    def add_arguments(self, parser):
        parser.add_argument("--user", help="only this username")
        parser.add_argument("--since", help="only jobs that ended since: 2h, 7d, 2025-01-31…")
        parser.add_argument("--dry-run", action="store_true", help="list them, change nothing")
        parser.add_argument("--limit", type=int, default=10_000, help="at most N jobs")

    def handle(self, *args, user, since, dry_run: bool, limit: int, **options):
        if limit < 1:
            raise CommandError("--limit must be at least 1.")
        user_id = None
        if user is not None:
            user_id = User.objects.filter(username=user).values_list("pk", flat=True).first()
            if user_id is None:
                raise CommandError(f"no user {user!r}; check the username in the admin")
        since_at = parse_since(since, now=timezone.now()) if since else None
        targets = retryable_failed_jobs(user_id=user_id, since=since_at, limit=limit)
        counts: Counter[str] = Counter()
        rows = []
        for job_id in progress(targets, label="retry analyses", stream=self.stderr):
            try:
                retried = analysis_job_retry(job_id=job_id, actor=ACTOR, dry_run=dry_run)
            except RunsError as exc:
                outcome, detail = "refused", str(exc)
            else:
                outcome = retried.outcome.value.replace("_", " ")
                if retried.outcome is RetryOutcome.RETRIED:
                    detail = f"job {retried.new_job_id} ({retried.status}); {retried.replaces}"
                elif retried.outcome is RetryOutcome.WOULD_RETRY:
                    detail = retried.replaces
                else:
                    detail = f"as job {retried.new_job_id}"
            counts[outcome] += 1
            rows.append((job_id, outcome, detail))
        self.stdout.write(format_table(("job", "outcome", "detail"), rows))
        summary = ", ".join(f"{n} {name}" for name, n in counts.items())
        self.stdout.write(
            f"{len(targets)} failed analysis job(s): {summary or 'nothing to do'}"
            + (" (dry run: nothing changed)" if dry_run else "")
        )
