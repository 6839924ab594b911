"""Writes of the analyses domain: admission, processing, promotion, credits, runs, trim.

Every transition is a compare-and-set on a locked row or a single conditional statement,
so a retried task, a second worker or a second promoter never applies it twice. The
per-user queue lock (``runs.queue.ANALYSIS_QUEUE_LOCK``) serialises admission, promotion
and cancellation of one user's jobs.
"""

from __future__ import annotations

import datetime
import enum
import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from accounts.models import User
from queueing import locks
from queueing.enqueue import Enqueued, Policy, enqueue
from queueing.exceptions import RetryLater
from queueing.rows import insert_or_get, replace_children
from runs import judge as judging
from runs.core import get_core, queries
from runs.exceptions import (
    CoreStateError,
    CoreUnavailable,
    InsufficientCredits,
    InvalidAmount,
    JobNotFinished,
    JudgeError,
    NoCitations,
    NothingToSave,
    ParentNotComplete,
)
from runs.models import (
    ACTIVE_STATUSES,
    RECORDABLE_STATUSES,
    TERMINAL_STATUSES,
    AnalysisJob,
    AnalysisRun,
    CreditEntry,
    CreditKind,
    JobCitation,
    JobStatus,
    RunJudgement,
    SavedBy,
)
from runs.queue import (
    ANALYSIS_QUEUE,
    ANALYSIS_QUEUE_LOCK,
    JUDGE_RUN_KEY,
    JUDGE_RUN_TASK,
    PROCESS_JOB_KEY,
    PROCESS_JOB_TASK,
    RUNS_QUEUE,
)
from runs.selectors import analysis_job_for_user, credit_balance, queue_position

logger = logging.getLogger(__name__)

#: Credits one analysis costs (charged at admission, refunded at most once).
ANALYSIS_PRICE = 1


class ProcessOutcome(enum.StrEnum):
    SKIPPED = "skipped"
    COMPLETE = "complete"
    FAILED = "failed"
    GAVE_UP = "gave_up"


@dataclass(frozen=True, kw_only=True)
class Admission:
    id: int
    run_id: uuid.UUID
    status: str
    queue_position: int


@dataclass(frozen=True, kw_only=True)
class Recorded:
    run_id: uuid.UUID | None
    version: int | None
    written: bool


@dataclass(frozen=True, kw_only=True)
class Saved:
    run: AnalysisRun
    written: bool


@dataclass(frozen=True, kw_only=True)
class Trimmed:
    trimmed: int
    kept_unsaved: tuple[int, ...]


def _release_window() -> datetime.timedelta:
    return datetime.timedelta(seconds=int(settings.RELEASE_RETRY_WINDOW_SECONDS))


def _enqueue_process(job_id: int) -> Enqueued:
    return enqueue(
        PROCESS_JOB_TASK,
        args={"job_id": job_id},
        key=PROCESS_JOB_KEY.build(job=job_id),
        policy=Policy.EXCLUSIVE,
        queue=RUNS_QUEUE,
    )


def _lock_job(job_id: int) -> AnalysisJob | None:
    return (
        AnalysisJob.objects.select_for_update()
        .defer("doc_html")
        .filter(pk=job_id, deleted_at__isnull=True)
        .first()
    )


# -- credits -----------------------------------------------------------------------------


def credit_grant(*, user_id: int, amount: int, note: str = "") -> int:
    """Add ``amount`` credits (a new ledger entry each call: grants are not idempotent)
    and return the new balance."""
    if amount <= 0:
        raise InvalidAmount(f"a credit grant must be a positive whole number, got {amount}")
    with transaction.atomic():
        CreditEntry.objects.create(
            user_id=user_id, kind=CreditKind.GRANT, amount=amount, note=note[:200]
        )
        return credit_balance(user_id=user_id)


def _credit_refund(job: AnalysisJob, *, note: str) -> bool:
    """Refund the job's charge; the unique (job, kind) makes a second refund a no-op."""
    _, created = insert_or_get(
        CreditEntry,
        values={
            "user": job.user_id,
            "job": job.pk,
            "kind": CreditKind.REFUND.value,
            "amount": ANALYSIS_PRICE,
            "note": note[:200],
            "created_at": timezone.now(),
        },
        conflict_fields=("job", "kind"),
    )
    return created


# -- admission and promotion -------------------------------------------------------------


def analysis_job_admit(
    *,
    user: User,
    title: str,
    doc_html: str,
    sources: Sequence[Mapping[str, object]],
    delta_of_job_id: int | None = None,
) -> Admission:
    """Run every synchronous check, then admit the job ``pending`` (slot free) or
    ``queued``; delta re-checks are always ``pending``.

    One transaction under the user's queue lock: the balance check, the held core run,
    the job row, the charge and (when ``pending``) its ``process_job`` commit together,
    so a refused admission charges nothing and leaves no row, and two concurrent admits
    of one user can neither both take the slot nor overdraw the balance.
    """
    if not judging.extract_citations(doc_html):
        raise NoCitations()
    core = get_core()
    with transaction.atomic():
        locks.xact_lock(ANALYSIS_QUEUE_LOCK, user.pk)
        parent = None
        if delta_of_job_id is not None:
            parent = analysis_job_for_user(user=user, job_id=delta_of_job_id)
            if parent.status != JobStatus.COMPLETE:
                raise ParentNotComplete(
                    f"job {parent.pk} is {parent.status}; a delta re-check needs a "
                    "complete analysis"
                )
        balance = credit_balance(user_id=user.pk)
        if balance < ANALYSIS_PRICE:
            raise InsufficientCredits(
                f"the balance is {balance} credit(s) and an analysis costs {ANALYSIS_PRICE}; "
                "ask an operator to run manage.py grant_credits"
            )
        run_id = parent.run_id if parent else uuid.uuid4()
        core_run_id = core.create_held(run_id=run_id, user_id=user.pk, sources=sources)
        admitted = ANALYSIS_QUEUE.admit(
            key=user.pk,
            values={
                "tenant": user.tenant_id,
                "run_id": run_id,
                "delta_of_job": parent.pk if parent else None,
                "title": title,
                "doc_html": doc_html,
                "sources": [dict(s) for s in sources],
                "error": "",
                "core_run": core_run_id,
                "release_attempts": 0,
            },
        )
        CreditEntry.objects.create(
            user_id=user.pk,
            job_id=admitted.id,
            kind=CreditKind.CHARGE,
            amount=-ANALYSIS_PRICE,
            note=f"analysis job {admitted.id}",
        )
        if admitted.status == JobStatus.PENDING:
            _enqueue_process(admitted.id)
        job = AnalysisJob.objects.only("pk", "user", "status", "created_at", "delta_of_job").get(
            pk=admitted.id
        )
        position = queue_position(job)
    return Admission(id=admitted.id, run_id=run_id, status=admitted.status, queue_position=position)


def _promote_next(user_id: int) -> int | None:
    promoted = ANALYSIS_QUEUE.promote(key=user_id)
    if promoted is not None:
        _enqueue_process(promoted)
    return promoted


def analysis_queue_promote(*, user_id: int) -> int | None:
    """Start the user's oldest queued job if nothing of theirs is active, and enqueue its
    ``process_job`` in the same transaction. Under the user's queue lock: two promoters
    never start two jobs; calling it again is a no-op."""
    with transaction.atomic():
        return _promote_next(user_id)


def analysis_queue_resume(*, limit: int = 500) -> list[int]:
    """Promote for every user with queued work and nothing active (the resume tick).
    Each promotion takes the user's lock and re-checks, so a stale list is harmless."""
    promoted = []
    for user_id in ANALYSIS_QUEUE.stuck_keys(limit=limit):
        job_id = analysis_queue_promote(user_id=user_id)
        if job_id is not None:
            promoted.append(job_id)
    return promoted


def analysis_jobs_requeue_lost(*, idle_seconds: int, limit: int = 500) -> int:
    """Enqueue ``process_job`` for active jobs idle for ``idle_seconds`` whose task is
    gone (it failed for good, or was lost with its worker). The EXCLUSIVE key makes this
    a no-op for every job whose task is still waiting, retrying or running."""
    cutoff = timezone.now() - datetime.timedelta(seconds=idle_seconds)
    job_ids = (
        AnalysisJob.objects.filter(
            status__in=ACTIVE_STATUSES, deleted_at__isnull=True, updated_at__lt=cutoff
        )
        .order_by("updated_at")
        .values_list("pk", flat=True)[:limit]
    )
    return sum(_enqueue_process(job_id).created for job_id in job_ids)


def analysis_job_cancel(*, job_id: int) -> bool:
    """Cancel a queued job and refund its credit; False when it is no longer queued.
    Under the user's queue lock, so a promoter cannot start it meanwhile.

    A job that is not queued is refused before any lock: ``process_job`` takes the job's
    row lock and then the user's, so taking them the other way round here must only ever
    meet queued jobs (which no worker holds)."""
    row = AnalysisJob.objects.filter(pk=job_id).values_list("user_id", "status").first()
    if row is None or row[1] != JobStatus.QUEUED:
        return False
    user_id = row[0]
    with transaction.atomic():
        locks.xact_lock(ANALYSIS_QUEUE_LOCK, user_id)
        job = _lock_job(job_id)
        if job is None or job.status != JobStatus.QUEUED:
            return False
        now = timezone.now()
        AnalysisJob.objects.filter(pk=job.pk).update(
            status=JobStatus.CANCELLED,
            error="cancelled by an operator",
            finished_at=now,
            updated_at=now,
        )
        _credit_refund(job, note=f"analysis job {job.pk} cancelled")
    return True


# -- processing --------------------------------------------------------------------------


def _job_fail(job: AnalysisJob, *, reason: str) -> None:
    """Mark the (locked) job failed, refund it once, and hand its slot on."""
    now = timezone.now()
    AnalysisJob.objects.filter(pk=job.pk).update(
        status=JobStatus.FAILED, error=reason, finished_at=now, updated_at=now
    )
    _credit_refund(job, note=f"analysis job {job.pk} failed")
    if not job.is_delta:
        _promote_next(job.user_id)


def _release_failed_reason(job: AnalysisJob, exc: Exception) -> str:
    minutes = int(_release_window().total_seconds() // 60)
    return (
        f"the core service stayed unreachable for the whole {minutes}-minute release window "
        f"({job.release_attempts} attempts; last error: {exc}); the credit was refunded"
    )


def analysis_job_process(*, job_id: int) -> ProcessOutcome:
    """Run one analysis: mark it running, release its held core run, judge its citations,
    write verdicts and results, mark it complete, and promote the user's next job.

    Idempotent and retry-safe: each step is a compare-and-set on the locked job row, a
    job that is not active is skipped, and a release that already happened is not
    repeated. While the core is unreachable it raises :class:`RetryLater` bounded by the
    job's ``release_deadline`` (set at the first attempt); past it the job fails and its
    credit is refunded exactly once.
    """
    core = get_core()
    retry_until = None
    with transaction.atomic():
        job = _lock_job(job_id)
        if job is None or job.status not in ACTIVE_STATUSES:
            return ProcessOutcome.SKIPPED
        now = timezone.now()
        if job.status == JobStatus.PENDING:
            job.status, job.started_at = JobStatus.RUNNING, now
        if job.released_at is None:
            if job.release_deadline is None:
                job.release_deadline = now + _release_window()
            job.release_attempts += 1
            try:
                core.release(core_run_id=job.core_run_id)
                core.start(core_run_id=job.core_run_id)
                job.released_at = now
            except CoreUnavailable as exc:
                if now >= job.release_deadline:
                    _save_attempt(job, now)
                    _job_fail(job, reason=_release_failed_reason(job, exc))
                    return ProcessOutcome.GAVE_UP
                retry_until = job.release_deadline
            except CoreStateError as exc:
                # The core will never release this run (an operator closed it): final.
                _save_attempt(job, now)
                _job_fail(job, reason=f"the core refused to release the run: {exc}")
                return ProcessOutcome.FAILED
        _save_attempt(job, now)
    if retry_until is not None:
        raise RetryLater(
            f"core unreachable releasing analysis job {job_id}; retrying until {retry_until}",
            deadline=retry_until,
        )

    # Judge outside any transaction: a slow (remote) judge must not hold the row lock.
    doc_html, sources = AnalysisJob.objects.values_list("doc_html", "sources").get(pk=job_id)
    judge = judging.get_judge()
    try:
        verdicts = judging.judge_document(doc_html=doc_html or "", sources=sources, judge=judge)
    except JudgeError as exc:
        with transaction.atomic():
            job = _lock_job(job_id)
            if job is None or job.status != JobStatus.RUNNING:
                return ProcessOutcome.SKIPPED
            _finish_core(core, job, ok=False, detail=str(exc))
            _job_fail(job, reason=f"the judge could not judge this document: {exc}")
        return ProcessOutcome.FAILED

    with transaction.atomic():
        job = _lock_job(job_id)
        if job is None or job.status != JobStatus.RUNNING:
            return ProcessOutcome.SKIPPED
        _finish_core(core, job, ok=True)
        replace_children(
            JobCitation,
            parent={"job_id": job.pk},
            rows=[
                JobCitation(
                    marker=v.marker,
                    source_key=v.source_key,
                    claim=v.claim,
                    verdict=v.verdict,
                    score=v.score,
                )
                for v in verdicts
            ],
        )
        items = [v.as_json() for v in verdicts]
        now = timezone.now()
        AnalysisJob.objects.filter(pk=job.pk).update(
            status=JobStatus.COMPLETE,
            results={"judge": judge.name, "verdicts": items, "summary": judging.summarize(items)},
            error="",
            finished_at=now,
            updated_at=now,
        )
        if not job.is_delta:
            _promote_next(job.user_id)
    return ProcessOutcome.COMPLETE


def _save_attempt(job: AnalysisJob, now: datetime.datetime) -> None:
    job.updated_at = now
    job.save(
        update_fields=[
            "status",
            "started_at",
            "release_deadline",
            "release_attempts",
            "released_at",
            "updated_at",
        ]
    )


def _finish_core(core, job: AnalysisJob, *, ok: bool, detail: str = "") -> None:
    try:
        core.finish(core_run_id=job.core_run_id, ok=ok, detail=detail)
    except CoreUnavailable as exc:
        # Nothing of this attempt is committed; the verdicts are recomputed next time.
        raise RetryLater(f"core unreachable closing analysis job {job.pk}") from exc


def analysis_job_give_up(*, job_id: int) -> bool:
    """Fail a running job whose release window closed without a release, refunding its
    credit once (the resume tick's safety net for a retry that never came back).
    Compare-and-set on the locked row: False when the job moved on meanwhile."""
    with transaction.atomic():
        job = _lock_job(job_id)
        if (
            job is None
            or job.status != JobStatus.RUNNING
            or job.released_at is not None
            or job.release_deadline is None
            or job.release_deadline > timezone.now()
        ):
            return False
        _job_fail(job, reason=_release_failed_reason(job, CoreUnavailable()))
    return True


# -- runs ----------------------------------------------------------------------------------


def analysis_run_record(*, job_id: int, saved_by: SavedBy) -> Recorded:
    """Record the job's run with the precedence UPSERT (``runs.sql``: ``record_run``) and,
    when it wrote, enqueue the run's judge job in the same transaction — so no run is
    ever recorded but not judged. Idempotent: a repeat writes nothing.

    Takes the job's row lock first (a no-op for the sweep, which holds it): a writer
    must never hold an uncommitted run row while it waits for the job row, or it would
    deadlock with a sweep that holds the job FOR UPDATE (which blocks the run's foreign
    key check) and waits for that run row.
    """
    with transaction.atomic():
        AnalysisJob.objects.select_for_update(no_key=True).filter(pk=job_id).values_list(
            "pk", flat=True
        ).first()
        with connection.cursor() as cursor:
            cursor.execute(queries["record_run"], {"job_id": job_id, "saved_by": saved_by.value})
            row = cursor.fetchone()
        if row is None:
            return Recorded(run_id=None, version=None, written=False)
        run_id, version = row
        enqueue(
            JUDGE_RUN_TASK,
            args={"run_id": str(run_id), "version": version},
            key=JUDGE_RUN_KEY.build(run=run_id, version=version),
            policy=Policy.EXCLUSIVE,
            queue=RUNS_QUEUE,
        )
    return Recorded(run_id=run_id, version=version, written=True)


def analysis_run_save(*, user: User, job_id: int) -> Saved:
    """The client save (the browser saw its job terminal). ``written`` is False when the
    run already holds this save (or a later one): a repeat rewrites nothing."""
    job = analysis_job_for_user(user=user, job_id=job_id)
    if job.status not in RECORDABLE_STATUSES:
        if job.status == JobStatus.CANCELLED:
            raise NothingToSave("the analysis was cancelled; there is nothing to save")
        raise JobNotFinished(f"job {job.pk} is {job.status}; save its run once it is complete")
    recorded = analysis_run_record(job_id=job.pk, saved_by=SavedBy.CLIENT)
    run = AnalysisRun.objects.defer("doc_html").filter(pk=job.run_id).first()
    if run is None:
        raise NothingToSave()
    return Saved(run=run, written=recorded.written)


def analysis_run_judge(*, run_id: uuid.UUID, version: int) -> str:
    """Judge (and diagnose) one recorded run version, once: the unique (run, version)
    makes a repeat a no-op. A version that was overwritten meanwhile is left to the
    judge job of its successor."""
    run = (
        AnalysisRun.objects.filter(pk=run_id)
        .values("version", "results", "saved_by", "job_id")
        .first()
    )
    if run is None:
        return "missing"
    if run["version"] != version:
        return "superseded"
    results = run["results"] or {}
    summary = {
        "judge": results.get("judge"),
        "verdicts": judging.summarize(results.get("verdicts") or []),
        "saved_by": run["saved_by"],
        "job_id": run["job_id"],
    }
    _, created = insert_or_get(
        RunJudgement,
        values={"run": run_id, "version": version, "summary": summary, "judged_at": timezone.now()},
        conflict_fields=("run", "version"),
    )
    return "judged" if created else "already_judged"


def doc_html_trim(*, hours: int, limit: int = 500) -> Trimmed:
    """Clear the body of jobs that ended more than ``hours`` ago, never from a job that
    still lacks its run (those are logged and counted). One bounded statement with
    SKIP LOCKED, so it never waits on (or races) the backstop sweep."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(queries["trim_doc_html"], {"hours": hours, "limit": limit})
        trimmed = len(cursor.fetchall())
    with connection.cursor() as cursor:
        cursor.execute(queries["untrimmable_unsaved"], {"hours": hours, "limit": limit})
        kept = tuple(row[0] for row in cursor.fetchall())
    if kept:
        logger.warning(
            "doc_html trim kept the body of %d ended job(s) that still lack their run "
            "(the unsaved_runs sweep should record them): %s",
            len(kept),
            ", ".join(map(str, kept[:20])),
        )
    return Trimmed(trimmed=trimmed, kept_unsaved=kept)


# -- operator actions (the admin) ----------------------------------------------------------


class RequeueOutcome(enum.StrEnum):
    ENQUEUED = "enqueued"
    ALREADY_WAITING = "already_waiting"
    NOT_ACTIVE = "not_active"


class RefundOutcome(enum.StrEnum):
    REFUNDED = "refunded"
    ALREADY_REFUNDED = "already_refunded"
    NOT_FINISHED = "not_finished"
    NOT_CHARGED = "not_charged"
    MISSING = "missing"


def analysis_job_requeue(*, job_id: int) -> RequeueOutcome:
    """Enqueue a pending or running job's ``process_job`` again (an operator's retry of a
    job whose task failed for good or was lost with its worker).

    A queued job waits for its promotion and a terminal job is final: both are
    ``NOT_ACTIVE`` and nothing is enqueued. Under the job's row lock, so the check cannot
    race the job's own move to a terminal status; the EXCLUSIVE key makes a requeue a
    no-op (``ALREADY_WAITING``) while the job's task waits, retries or runs.
    """
    with transaction.atomic():
        job = _lock_job(job_id)
        if job is None or job.status not in ACTIVE_STATUSES:
            return RequeueOutcome.NOT_ACTIVE
        enqueued = _enqueue_process(job.pk)
    return RequeueOutcome.ENQUEUED if enqueued.created else RequeueOutcome.ALREADY_WAITING


def analysis_job_refund(*, job_id: int, note: str = "") -> RefundOutcome:
    """Give a finished job's credit back (an operator's refund, e.g. for a poor result).

    Exactly once: the credit ledger's unique (job, kind) turns a repeat, and a refund the
    job already got when it failed or was cancelled, into ``ALREADY_REFUNDED``. Only a
    terminal job that was charged is refunded, so a refund never precedes the job's own
    (failure or cancellation) refund nor gives back what was never charged. Under the
    job's row lock, the lock every transition of a job takes; not under the user's queue
    lock, which ``process_job`` takes while it holds the row (the reverse order could
    deadlock with a job that is finishing).
    """
    with transaction.atomic():
        job = _lock_job(job_id)
        if job is None:
            return RefundOutcome.MISSING
        if job.status not in TERMINAL_STATUSES:
            return RefundOutcome.NOT_FINISHED
        if not CreditEntry.objects.filter(job_id=job.pk, kind=CreditKind.CHARGE).exists():
            return RefundOutcome.NOT_CHARGED
        created = _credit_refund(job, note=note or f"analysis job {job.pk} refunded")
    return RefundOutcome.REFUNDED if created else RefundOutcome.ALREADY_REFUNDED
