"""Concurrency harness of the runs tests: a sampler of invariant 4 and the credit
scenario (admitters, promoters, workers and a clock-mover racing each other)."""

from __future__ import annotations

import threading
import time

from django.db import connection
from django.db.models import Sum

from queueing.sweeps import run_sweep
from runs import admission
from runs.exceptions import InsufficientCredits
from runs.models import AnalysisJob, CreditEntry, CreditKind, JobStatus
from runs.selectors import credit_balance
from tests.conftest import run_concurrently
from tests.runs.factories import (
    DOC_HTML,
    SOURCES,
    active_first_pass_per_user,
    drain,
    register_worker,
)
from tests.runs.fakes import OUTAGE_KEY


class Sampler(threading.Thread):
    """Samples, on its own connection, whether any user has two first-pass jobs active."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[dict[int, int]] = []

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                found = active_first_pass_per_user()
                if found:
                    self.violations.append(found)
                self.samples += 1
        finally:
            connection.close()

    def __enter__(self) -> Sampler:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.set()
        self.join(timeout=10)


GRANT = 5
ATTEMPTS_PER_USER = 8
LIVE = (JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING)


def sources_for(attempt: int) -> list[dict]:
    if attempt % 3 == 0:
        return [*SOURCES, {"key": OUTAGE_KEY, "title": "down at release"}]
    return SOURCES


def expire_held_releases() -> None:
    """Move every pending release window into the past (the outage outlasted it)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE analysis_jobs SET release_deadline = now() - interval '1 minute' "
            "WHERE status = 'running' AND released_at IS NULL "
            "AND release_deadline > now() - interval '1 minute'"
        )


class Scenario:
    """Admitters first; promoters, workers and a clock-mover loop until nothing is live."""

    def __init__(self, users, *, workers: int, deadline_seconds: float = 60) -> None:
        self.users = users
        self.attempts = [(u, a) for u in users for a in range(ATTEMPTS_PER_USER)]
        self.workers = workers
        self.admitting = len(self.attempts)
        self.lock = threading.Lock()
        self.deadline = time.monotonic() + deadline_seconds
        self.violations: list[dict] = []
        self.worker_id = register_worker() if workers else None

    def settled(self) -> bool:
        with self.lock:
            admitting = self.admitting
        return (admitting == 0 and not AnalysisJob.objects.filter(status__in=LIVE).exists()) or (
            time.monotonic() > self.deadline
        )

    def admit(self, index: int):
        user, attempt = self.attempts[index]
        try:
            return admission.analysis_job_admit(
                user=user, title=f"T{attempt}", doc_html=DOC_HTML, sources=sources_for(attempt)
            )
        finally:
            with self.lock:
                self.admitting -= 1

    def loop(self, body) -> None:
        while not self.settled():
            body()
            found = active_first_pass_per_user()
            if found:
                self.violations.append(found)

    def role(self, i: int):
        roles = [lambda: run_sweep("analysis_resume")] * 2 + [expire_held_releases]
        roles += [lambda: drain(worker_id=self.worker_id)] * self.workers
        if i < len(roles):
            return self.loop(roles[i])
        return self.admit(i - len(roles))

    def run(self) -> list[object]:
        return run_concurrently(self.role, 3 + self.workers + len(self.attempts))


def assert_credit_invariant(users, admissions) -> None:
    errors = [
        a
        for a in admissions
        if isinstance(a, BaseException) and not isinstance(a, InsufficientCredits)
    ]
    assert not errors, errors
    rejected = [a for a in admissions if isinstance(a, InsufficientCredits)]
    jobs = dict(AnalysisJob.objects.values_list("pk", "status"))
    assert len(jobs) + len(rejected) == len(users) * ATTEMPTS_PER_USER
    assert set(jobs.values()) <= {JobStatus.COMPLETE, JobStatus.FAILED}, jobs

    charges = CreditEntry.objects.filter(kind=CreditKind.CHARGE)
    refunds = CreditEntry.objects.filter(kind=CreditKind.REFUND)
    assert sorted(charges.values_list("job_id", flat=True)) == sorted(jobs)
    refunded = set(refunds.values_list("job_id", flat=True))
    failed = {pk for pk, status in jobs.items() if status == JobStatus.FAILED}
    assert refunds.count() == len(refunded)
    assert refunded == failed
    outage_jobs = {
        j.pk for j in AnalysisJob.objects.all() if any(s["key"] == OUTAGE_KEY for s in j.sources)
    }
    assert failed == outage_jobs and failed
    charged = -(charges.aggregate(total=Sum("amount"))["total"] or 0)
    paid_back = refunds.aggregate(total=Sum("amount"))["total"] or 0
    assert charged - paid_back == len(jobs) - len(refunded)
    for user in users:
        balance = credit_balance(user_id=user.pk)
        mine = AnalysisJob.objects.filter(user=user)
        assert balance >= 0
        assert balance == GRANT - mine.count() + mine.filter(status=JobStatus.FAILED).count()
