"""A hypothesis state machine over the analyses' services and the framework under them:
admit (first-pass and delta), process, fail, crash, save, stale save, sweep, promote,
cancel (the analysis or its task), a core outage, and moving the clock — every safety
invariant of docs/design.md#invariants after every step, and after settling, every
settled and liveness invariant. ``STATEFUL_EXAMPLES`` (15) sets how many runs of up to
30 steps it tries.

Jobs run in this process through the same pieces a worker uses: procrastinate's fetch,
the task's own retry strategy, the worker's fenced finish and retry statements, and the
give-up hook after a saved failure. A "crash" fetches a job under a worker that then falls
silent; only the stalled-recovery sweep can bring that job back. Time moves by
back-dating rows.
"""

from __future__ import annotations

import contextlib
import json
import os

import pytest
from django.conf import settings as django_settings
from django.db import connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from procrastinate.contrib.django import app
from procrastinate.jobs import Job

from queueing import giveup
from queueing.jobs import CancelRefused, job_cancel
from queueing.sweeps import run_sweep
from queueing.worker import queries as worker_queries
from runs import admission, durability
from runs.exceptions import RunsError
from runs.judge import Judgement, OverlapJudge, Source
from runs.models import AnalysisJob, JobStatus
from tests.invariants import assert_invariants, assert_live
from tests.runs.factories import DOC_HTML, SOURCES, funded_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TABLES = (
    "run_judgements, analysis_runs, job_citations, credit_balance_marks, credit_ledger, "
    "analysis_jobs, core_runs, "
    "core_daily_usage, pgstage_job_stalls, procrastinate_events, procrastinate_periodic_defers, "
    "procrastinate_jobs, procrastinate_workers"
)


class SwitchableJudge(OverlapJudge):
    """The default judge, crashing while ``failing`` is set (a bug, not a JudgeError)."""

    failing = False

    def judge(self, *, claim: str, source: Source | None) -> Judgement:
        if SwitchableJudge.failing:
            raise RuntimeError("the judge crashed")
        return super().judge(claim=claim, source=source)


def execute(sql: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


def new_worker() -> int:
    return execute("INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id")[0][0]


class Analyses(RuleBasedStateMachine):
    jobs = Bundle("jobs")

    @initialize()
    def setup(self) -> None:
        execute(f"TRUNCATE {TABLES} RESTART IDENTITY CASCADE")
        self.users = [funded_user(credits=6), funded_user(credits=2)]
        self.worker_id = new_worker()
        SwitchableJudge.failing = False
        django_settings.CORE_AVAILABLE = True

    # -- the user ----------------------------------------------------------------------

    @rule(target=jobs, user=st.sampled_from([0, 1]))
    def admit(self, user):
        try:
            admitted = admission.analysis_job_admit(
                user=self.users[user], title="t", doc_html=DOC_HTML, sources=SOURCES
            )
        except RunsError:
            return multiple()
        return admitted.id

    @rule(target=jobs, parent=jobs)
    def admit_delta(self, parent):
        job = AnalysisJob.objects.get(pk=parent)
        try:
            admitted = admission.analysis_job_admit(
                user=job.user,
                title="delta",
                doc_html=DOC_HTML,
                sources=SOURCES,
                delta_of_job_id=job.pk,
            )
        except RunsError:
            return multiple()
        return admitted.id

    @rule(job=jobs)
    def save(self, job):
        """A client save — of the newest job of its run, or a stale one."""
        owner = AnalysisJob.objects.get(pk=job).user
        with contextlib.suppress(RunsError):
            durability.analysis_run_save(user=owner, job_id=job)

    # -- workers -----------------------------------------------------------------------

    def _run_one(self) -> bool:
        rows = execute(
            "SELECT id, status, task_name, priority, lock, queueing_lock, args, scheduled_at, "
            "queue_name, attempts, worker_id FROM procrastinate_fetch_job_v2(%s, %s)",
            [["analyses"], self.worker_id],
        )
        if not rows or rows[0][0] is None:
            return False
        names = (
            "id",
            "status",
            "task_name",
            "priority",
            "lock",
            "queueing_lock",
            "args",
            "scheduled_at",
            "queue_name",
            "attempts",
            "worker_id",
        )
        row = dict(zip(names, rows[0], strict=True))
        if isinstance(row["args"], str):
            row["args"] = json.loads(row["args"])
        job = Job.from_row(row)
        task = app.tasks[job.task_name]
        fenced = {"job_id": job.id, "worker_id": self.worker_id, "attempts": job.attempts}
        try:
            task.func(**job.task_kwargs)
        except Exception as exc:
            decision = (
                task.retry_strategy.get_retry_decision(exception=exc, job=job)
                if task.retry_strategy
                else None
            )
            if decision is not None:
                execute(
                    worker_queries["retry_job_fenced"],
                    {
                        **fenced,
                        "retry_at": decision.retry_at,
                        "priority": None,
                        "queue": None,
                        "lock": None,
                        "abort_reason": None,
                    },
                )
                return True
            # As the worker does: save the failure, owing the task's give-up hook, then
            # run the hook (it settles the domain).
            owes = str(exc) if giveup.has_hook(job.task_name) else None
            saved = execute(
                worker_queries["finish_job_fenced"],
                {**fenced, "status": "failed", "delete_job": False, "owed_reason": owes},
            )
            if saved and owes is not None:
                giveup.settle_owed(job_id=job.id)
            return True
        execute(
            worker_queries["finish_job_fenced"],
            {**fenced, "status": "succeeded", "delete_job": False, "owed_reason": None},
        )
        return True

    @rule()
    def process(self):
        self._run_one()

    @rule()
    def process_failing(self):
        SwitchableJudge.failing = True
        try:
            self._run_one()
        finally:
            SwitchableJudge.failing = False

    @rule()
    def crash(self):
        """A worker takes a job and dies with it (its heartbeat stops)."""
        doomed = new_worker()
        execute("SELECT id FROM procrastinate_fetch_job_v2(%s, %s)", [["analyses"], doomed])
        execute(
            "UPDATE procrastinate_workers SET last_heartbeat = now() - interval '1 hour' "
            "WHERE id = %s",
            [doomed],
        )

    @rule(down=st.booleans())
    def core_outage(self, down):
        django_settings.CORE_AVAILABLE = not down

    # -- operators and sweeps ----------------------------------------------------------

    @rule(
        name=st.sampled_from(["stalled_jobs", "analysis_resume", "unsaved_runs", "doc_html_trim"])
    )
    def sweep(self, name):
        run_sweep(name)

    @rule(user=st.sampled_from([0, 1]))
    def promote(self, user):
        admission.analysis_queue_promote(user_id=self.users[user].pk)

    @rule(job=jobs)
    def cancel(self, job):
        admission.analysis_job_cancel(job_id=job)

    @rule()
    def cancel_a_task(self):
        waiting = execute(
            "SELECT id FROM procrastinate_jobs WHERE status = 'todo' AND queue_name = 'analyses' "
            "ORDER BY id LIMIT 1"
        )
        if waiting:
            with contextlib.suppress(CancelRefused):  # e.g. a recorded run's judge
                job_cancel(job_id=waiting[0][0], actor="admin:ops")

    @rule(seconds=st.sampled_from([20, 130, 3600, 2 * 86400]))
    def advance_clock(self, seconds):
        interval = f"{int(seconds)} seconds"
        execute(
            "UPDATE analysis_jobs SET updated_at = updated_at - %s::interval, "
            "finished_at = finished_at - %s::interval, "
            "release_deadline = release_deadline - %s::interval",
            [interval] * 3,
        )
        execute(
            "UPDATE procrastinate_jobs SET scheduled_at = scheduled_at - %s::interval "
            "WHERE scheduled_at IS NOT NULL",
            [interval],
        )
        execute(
            "UPDATE procrastinate_workers SET last_heartbeat = "
            "CASE WHEN id = %s THEN now() ELSE last_heartbeat - %s::interval END",
            [self.worker_id, interval],
        )
        # Stalled recovery watched all along (a live worker runs it): its clock's last
        # resumption moves back with the heartbeats, its last run stays recent.
        execute(
            "UPDATE pgstage_inline_sweeps SET resumed_at = resumed_at - %s::interval",
            [interval],
        )

    # -- invariants --------------------------------------------------------------------

    @invariant()
    def safety(self):
        assert_invariants()

    def teardown(self):
        """Settle: the core is back, time passes, sweeps run, workers drain — then
        everything that can finish has, every run is recorded and judged, nothing waits."""
        SwitchableJudge.failing = False
        django_settings.CORE_AVAILABLE = True
        for _ in range(30):
            self.advance_clock(4000)
            for name in ("stalled_jobs", "analysis_resume", "unsaved_runs"):
                run_sweep(name, batch_size=1000)
            while self._run_one():
                pass
            if not AnalysisJob.objects.filter(
                status__in=(JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING)
            ).exists() and not execute(
                "SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing') "
                "AND queue_name = 'analyses'"
            ):
                break
        self.advance_clock(4000)  # past the save grace of the jobs that just ended
        run_sweep("unsaved_runs", batch_size=1000)
        while self._run_one():
            pass
        assert_invariants(settled=True)
        assert_live()


@pytest.mark.timeout(1800)
def test_analyses_hold_every_invariant_whatever_happens_in_whatever_order(clean_queue):
    django_settings.RUNS_JUDGE = "tests.runs.test_stateful.SwitchableJudge"
    try:
        run_state_machine_as_test(
            Analyses,
            settings=settings(
                max_examples=int(os.environ.get("STATEFUL_EXAMPLES", "15")),
                stateful_step_count=30,
                deadline=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        del django_settings.RUNS_JUDGE
        django_settings.CORE_AVAILABLE = True
