"""A seeded random walk over the analyses' money, budget and content.

Each step is one thing a user, a worker, an operator or the clock does — grant credits,
admit (first pass or delta re-check), process a job (the judge succeeding or refusing),
a core outage starting or ending, cancel a queued job, an operator's refund, retry one
failed analysis, replay every failed one (the command), a client save (current or
stale), a sweep, deactivating or reactivating a user, time passing — and after every
step the walk checks:

* balances: each user's balance is what was granted less what was charged plus what was
  refunded, and never negative;
* one charge per job, at most one refund, and a refund exactly for the jobs that ended
  failed or cancelled (or that an operator refunded);
* the tenant's budget: each day's use counts exactly the core runs that are not
  cancelled, a cancelled run was never released, and once the core is reachable and the
  resume tick ran, no held run is left whose job ended: the budget is given back exactly
  when the provider did no work;
* "a run holds its newest content": within a run, a later job never carries an older
  version of the document (a retry keeps its version), and the run's saved document is
  that of the job it names.

After the walk everything settles (core back, clock forward, sweeps, workers drain) and
the settled checks hold: nothing waits, every result is saved, the budget counts exactly
the runs the provider worked on.

Jobs run in this process through procrastinate's own fetch (``drain``); time moves by
back-dating rows. The default (``LEDGER_WALK_SEEDS`` = 4 seeds of ``LEDGER_WALK_STEPS`` =
60 steps) is part of ``make test``; a longer profile by hand, e.g.
``LEDGER_WALK_SEEDS=20 LEDGER_WALK_STEPS=400 pytest tests/runs/test_ledger_walk.py``. A
seed that ever failed is added to ``KNOWN_SEEDS``.
"""

from __future__ import annotations

import os
import random
import re
from collections import Counter, defaultdict
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection

from queueing.sweeps import run_sweep
from runs import admission, durability, operations
from runs.credits import credit_grant
from runs.exceptions import RunsError
from runs.models import AnalysisJob, JobStatus
from tests.factories import TenantFactory
from tests.runs.factories import SOURCES, drain, funded_user

SEEDS = int(os.environ.get("LEDGER_WALK_SEEDS", "4"))
STEPS = int(os.environ.get("LEDGER_WALK_STEPS", "60"))
#: Seeds that once found a defect stay in the default run.
KNOWN_SEEDS: tuple[int, ...] = (9,)  # a retry made an older document newer
BUDGET = 8
REFUSING_JUDGE = "tests.runs.test_release.RefusingJudge"
_VERSION = re.compile(r"Version (\d+)\b")


def doc(version: int) -> str:
    return (
        f"<p>Version {version}: water boils at one hundred degrees at sea level [thermo]. "
        "The moon is made of green cheese [moon].</p>"
    )


def rows(sql: str, params=None) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


class Walk:
    def __init__(self, seed: int, settings) -> None:
        self.rng = random.Random(seed)
        self.settings = settings
        settings.CORE_DAILY_BUDGET = BUDGET
        settings.CORE_AVAILABLE = True
        # Rolled back with the test: only this walk's jobs are drained.
        rows("DELETE FROM procrastinate_jobs WHERE queue_name = 'analyses' RETURNING id")
        shared = TenantFactory()
        self.users = [
            funded_user(credits=6, tenant=shared),
            funded_user(credits=4, tenant=shared),
            funded_user(credits=4),
        ]
        self.granted = {u.pk: g for u, g in zip(self.users, (6, 4, 4), strict=True)}
        self.operator_refunds: set[int] = set()
        self.version: dict[int, int] = {}  # job → the version of the document it carries
        self.latest: dict[object, int] = {}  # run → its newest version so far
        self.log: list[str] = []
        self.resumed_while_up = False

    # -- steps -------------------------------------------------------------------------

    def grant(self) -> str:
        user = self.rng.choice(self.users)
        amount = self.rng.randint(1, 4)
        credit_grant(user_id=user.pk, amount=amount, note="walk")
        self.granted[user.pk] += amount
        return f"grant {amount} to {user.pk}"

    def admit(self) -> str:
        user = self.rng.choice(self.users)
        user.refresh_from_db(fields=["is_active"])
        try:
            admitted = admission.analysis_job_admit(
                user=user, title="walk", doc_html=doc(1), sources=SOURCES
            )
        except RunsError as exc:
            return f"admit for {user.pk} refused: {exc.code}"
        self.version[admitted.id] = 1
        self.latest[admitted.run_id] = 1
        return f"admit {admitted.id} ({admitted.status})"

    def admit_delta(self) -> str:
        parents = list(
            AnalysisJob.objects.filter(status=JobStatus.COMPLETE).values_list(
                "pk", "user_id", "run_id"
            )
        )
        if not parents:
            return "delta: no complete job"
        parent, user_id, run_id = self.rng.choice(parents)
        user = next(u for u in self.users if u.pk == user_id)
        user.refresh_from_db(fields=["is_active"])
        version = self.latest[run_id] + 1
        try:
            admitted = admission.analysis_job_admit(
                user=user,
                title="walk delta",
                doc_html=doc(version),
                sources=SOURCES,
                delta_of_job_id=parent,
            )
        except RunsError as exc:
            return f"delta of {parent} refused: {exc.code}"
        self.version[admitted.id] = version
        self.latest[run_id] = version
        return f"delta {admitted.id} of {parent} (v{version})"

    def process(self) -> str:
        refuse = self.rng.random() < 0.3
        if refuse:
            self.settings.RUNS_JUDGE = REFUSING_JUDGE
        try:
            ran = drain(limit=1)
        finally:
            if refuse:
                del self.settings.RUNS_JUDGE
        if not ran:
            return "process: nothing waits"
        return f"process {ran[0].task_name} {ran[0].args} → {ran[0].outcome}" + (
            " (judge refusing)" if refuse else ""
        )

    def core_outage(self) -> str:
        self.settings.CORE_AVAILABLE = not self.settings.CORE_AVAILABLE
        return f"core {'up' if self.settings.CORE_AVAILABLE else 'down'}"

    def cancel(self) -> str:
        queued = list(
            AnalysisJob.objects.filter(status=JobStatus.QUEUED).values_list("pk", flat=True)
        )
        if not queued:
            return "cancel: nothing queued"
        job_id = self.rng.choice(queued)
        return f"cancel {job_id}: {admission.analysis_job_cancel(job_id=job_id)}"

    def refund(self) -> str:
        ids = list(AnalysisJob.objects.values_list("pk", flat=True))
        if not ids:
            return "refund: no job"
        job_id = self.rng.choice(ids)
        outcome = operations.analysis_job_refund(job_id=job_id, note="walk")
        if outcome is operations.RefundOutcome.REFUNDED:
            self.operator_refunds.add(job_id)
        return f"refund {job_id}: {outcome}"

    def _retried(self, job_id: int, new_job_id: int | None) -> None:
        if new_job_id is not None and new_job_id not in self.version:
            self.version[new_job_id] = self.version[job_id]

    def retry(self) -> str:
        failed = list(
            AnalysisJob.objects.filter(status=JobStatus.FAILED).values_list("pk", flat=True)
        )
        if not failed:
            return "retry: nothing failed"
        job_id = self.rng.choice(failed)
        try:
            retried = operations.analysis_job_retry(
                job_id=job_id, actor="walk", dry_run=self.rng.random() < 0.2
            )
        except RunsError as exc:
            return f"retry {job_id} refused: {exc}"
        self._retried(job_id, retried.new_job_id)
        return f"retry {job_id}: {retried.outcome} {retried.new_job_id}"

    def replay(self) -> str:
        before = set(AnalysisJob.objects.values_list("pk", flat=True))
        out = StringIO()
        call_command("replay_failed_analyses", stdout=out, stderr=StringIO())
        for job_id, new_job_id in rows(
            "SELECT job_id, (payload->>'new_job_id')::bigint FROM analysis_audit "
            "WHERE (payload->>'new_job_id')::bigint <> ALL(%s)",
            [list(before)],
        ):
            self._retried(job_id, new_job_id)
        return "replay: " + out.getvalue().strip().splitlines()[-1]

    def save(self) -> str:
        done = list(
            AnalysisJob.objects.filter(
                status__in=(JobStatus.COMPLETE, JobStatus.FAILED)
            ).values_list("pk", "user_id")
        )
        if not done:
            return "save: nothing finished"
        job_id, user_id = self.rng.choice(done)
        user = next(u for u in self.users if u.pk == user_id)
        try:
            saved = durability.analysis_run_save(user=user, job_id=job_id)
        except RunsError as exc:
            return f"save {job_id}: {exc.code}"
        return f"save {job_id}: written={saved.written}"

    def sweep(self) -> str:
        name = self.rng.choice(["analysis_resume", "unsaved_runs", "doc_html_trim"])
        result = run_sweep(name)
        if name == "analysis_resume" and self.settings.CORE_AVAILABLE:
            self.resumed_while_up = True
        return f"sweep {name}: {result.notes or result.changed}"

    def toggle_active(self) -> str:
        user = self.rng.choice(self.users)
        user.refresh_from_db(fields=["is_active"])
        if user.is_active and self.rng.random() < 0.7:
            return "toggle: nobody deactivated"
        user.is_active = not user.is_active
        user.save(update_fields=["is_active"])
        return f"user {user.pk} {'active' if user.is_active else 'deactivated'}"

    def advance_clock(self, seconds: int | None = None) -> str:
        seconds = seconds or self.rng.choice([30, 130, 3600, 2 * 86400])
        interval = f"{seconds} seconds"
        rows(
            "UPDATE analysis_jobs SET updated_at = updated_at - %(i)s::interval, "
            "finished_at = finished_at - %(i)s::interval, "
            "release_deadline = release_deadline - %(i)s::interval RETURNING id",
            {"i": interval},
        )
        rows(
            "UPDATE procrastinate_jobs SET scheduled_at = scheduled_at - %(i)s::interval "
            "WHERE scheduled_at IS NOT NULL RETURNING id",
            {"i": interval},
        )
        return f"clock +{seconds}s"

    STEPS = (
        (grant, 2),
        (admit, 3),
        (admit_delta, 4),
        (process, 9),
        (core_outage, 1),
        (cancel, 1),
        (refund, 1),
        (retry, 3),
        (replay, 1),
        (save, 2),
        (sweep, 2),
        (toggle_active, 1),
        (advance_clock, 1),
    )

    # -- checks ------------------------------------------------------------------------

    def check(self) -> None:
        self.check_money()
        self.check_budget()
        self.check_content()

    def check_money(self) -> None:
        for user_id, balance, granted in rows(
            "SELECT user_id, sum(amount), sum(amount) FILTER (WHERE kind = 'grant') "
            "FROM credit_ledger GROUP BY user_id"
        ):
            assert granted == self.granted[user_id], f"grants of {user_id}"
            assert balance >= 0, f"user {user_id}'s balance is {balance}"
        bad = rows(
            "SELECT j.id, j.status, "
            "       count(*) FILTER (WHERE c.kind = 'charge'), "
            "       count(*) FILTER (WHERE c.kind = 'refund') "
            "  FROM analysis_jobs j LEFT JOIN credit_ledger c ON c.job_id = j.id "
            " GROUP BY j.id, j.status"
        )
        for job_id, status, charges, refunds in bad:
            assert charges == 1, f"job {job_id} charged {charges} times"
            assert refunds <= 1, f"job {job_id} refunded {refunds} times"
            owed = status in (JobStatus.FAILED, JobStatus.CANCELLED)
            expected = 1 if owed or job_id in self.operator_refunds else 0
            assert refunds == expected, f"job {job_id} ({status}) has {refunds} refund(s)"

    def check_budget(self) -> None:
        counted = rows(
            "SELECT u.tenant_id, u.day, u.used, "
            "       (SELECT count(*) FROM core_runs c JOIN users usr ON usr.id = c.user_id "
            "         WHERE usr.tenant_id = u.tenant_id AND c.state <> 'cancelled' "
            "           AND (c.created_at AT TIME ZONE 'UTC')::date = u.day) "
            "  FROM core_daily_usage u"
        )
        for tenant_id, day, used, runs in counted:
            assert used == runs, f"tenant {tenant_id} used {used} on {day} for {runs} run(s)"
            assert used <= BUDGET
        assert not rows(
            "SELECT id FROM core_runs WHERE state = 'cancelled' AND released_at IS NOT NULL"
        ), "a released run was given back"
        if self.resumed_while_up:
            self.resumed_while_up = False
            stuck = rows(
                "SELECT c.id FROM core_runs c WHERE c.state = 'held' AND NOT EXISTS "
                "(SELECT 1 FROM analysis_jobs j WHERE j.core_run_id = c.id "
                "   AND j.status IN ('queued', 'pending', 'running'))"
            )
            assert not stuck, f"held runs of ended jobs kept their budget: {stuck}"

    def check_content(self) -> None:
        by_run: dict[object, list[int]] = defaultdict(list)
        for job_id, run_id in rows("SELECT id, run_id FROM analysis_jobs ORDER BY id"):
            by_run[run_id].append(job_id)
        for run_id, job_ids in by_run.items():
            versions = [self.version[j] for j in job_ids]
            assert versions == sorted(versions), (
                f"run {run_id}: a later job carries an older document: "
                f"{list(zip(job_ids, versions, strict=True))}"
            )
        for run_id, job_id, run_doc in rows(
            "SELECT id, job_id, doc_html FROM analysis_runs WHERE job_id IS NOT NULL"
        ):
            version = int(_VERSION.search(run_doc)[1])
            assert version == self.version[job_id], f"run {run_id} holds another job's text"
            newest_saved = max(self.version[j] for j in by_run[run_id] if j <= job_id)
            assert version == newest_saved, f"run {run_id} went back to v{version}"

    # -- the walk ----------------------------------------------------------------------

    def run(self, steps: int) -> Counter:
        actions, weights = zip(*self.STEPS, strict=True)
        done: Counter = Counter()
        for _ in range(steps):
            action = self.rng.choices(actions, weights)[0]
            self.log.append(action(self))
            done[action.__name__] += 1
            try:
                self.check()
            except AssertionError as exc:
                raise AssertionError(f"{exc}\nafter:\n  " + "\n  ".join(self.log[-25:])) from exc
        self.settle()
        return done

    def settle(self) -> None:
        self.settings.CORE_AVAILABLE = True
        for user in self.users:
            user.refresh_from_db(fields=["is_active"])
        for _ in range(20):
            self.advance_clock(4000)
            run_sweep("analysis_resume", batch_size=1000)
            self.resumed_while_up = True
            drain()
            if not AnalysisJob.objects.filter(
                status__in=(JobStatus.QUEUED, JobStatus.PENDING, JobStatus.RUNNING)
            ).exists():
                break
        self.advance_clock(4000)  # past the save grace of the jobs that just ended
        run_sweep("unsaved_runs", batch_size=1000)
        drain()
        self.check()
        live = rows(
            "SELECT id, status FROM analysis_jobs WHERE status IN ('queued', 'pending', 'running')"
        )
        assert not live, f"left waiting: {live}"
        unsaved = rows(
            "SELECT j.id FROM analysis_jobs j WHERE j.status IN ('complete', 'failed') "
            "AND j.doc_html IS NOT NULL AND j.results IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM analysis_runs r WHERE r.id = j.run_id "
            "                 AND r.job_id >= j.id)"
        )
        assert not unsaved, f"results never saved: {unsaved}"
        (used,), (worked,) = (
            rows("SELECT coalesce(sum(used), 0) FROM core_daily_usage")[0],
            rows("SELECT count(*) FROM core_runs WHERE released_at IS NOT NULL")[0],
        )
        assert used == worked, f"{used} budget unit(s) spent for {worked} run(s) worked on"


@pytest.mark.django_db
@pytest.mark.parametrize("seed", [*KNOWN_SEEDS, *range(SEEDS)])
def test_money_budget_and_content_hold_after_every_step(seed, settings):
    done = Walk(seed, settings).run(STEPS)

    assert done["admit"] and done["process"], done
