"""Row durability: the client save, the backstop sweep, precedence in one UPSERT, the
judge enqueued with every recorded run, and the trim that never loses an unsaved body."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import connection

from queueing.sweeps import run_sweep
from runs import durability, processing
from runs.core import queries
from runs.models import AnalysisJob, AnalysisRun, JobStatus, RunJudgement, SavedBy
from tests.conftest import jobs, run_concurrently
from tests.runs.factories import AnalysisJobFactory, backdate, drain, funded_user, payload

GRACE = django_settings.SWEEP_GRACE_SECONDS


def run_writes() -> int:
    """analysis_runs tuple writes so far: every write is record_run's UPSERT, which
    inserts version 1 or bumps the version, so the versions add up to the writes."""
    return sum(AnalysisRun.objects.values_list("version", flat=True))


def run_tuples() -> dict:
    """Each run row's physical identity: unchanged means not rewritten."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, xmin::text, ctid::text FROM analysis_runs")
        return {row[0]: row[1:] for row in cursor.fetchall()}


def judge_jobs() -> list[dict]:
    return jobs(task_name="runs.judge_run")


def past_grace(*job_ids: int) -> None:
    # Well past: inside a test transaction now() is when the test began.
    backdate("analysis_jobs", job_ids, seconds=GRACE + 3600)


def record(job: AnalysisJob, saved_by: SavedBy) -> bool:
    return durability.analysis_run_record(job_id=job.pk, saved_by=saved_by).written


@pytest.mark.django_db
def test_client_save_writes_once_and_a_repeat_answers_200_without_rewriting(api):
    user = funded_user(credits=1)
    client = api(user)
    job_id = client.post("/api/analysis-jobs", payload()).json()["id"]
    processing.analysis_job_process(job_id=job_id)

    first = client.post("/api/analysis-runs", {"job_id": job_id})
    tuples = run_tuples()
    second = client.post("/api/analysis-runs", {"job_id": job_id})

    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json() == second.json()
    assert (first.json()["saved_by"], first.json()["version"]) == ("client", 1)
    assert run_writes() == 1 and run_tuples() == tuples
    assert [(j["args"]["run_id"], j["args"]["version"]) for j in judge_jobs()] == [
        (first.json()["id"], 1)
    ]
    run = AnalysisRun.objects.get()
    assert run.doc_html == AnalysisJob.objects.get(pk=job_id).doc_html
    assert run.results["summary"]["citations"] == 3


@pytest.mark.django_db
def test_client_save_of_an_unfinished_or_empty_job_is_409_and_writes_nothing(api):
    user = funded_user(credits=2)
    client = api(user)
    job_id = client.post("/api/analysis-jobs", payload()).json()["id"]
    failed = AnalysisJobFactory(user=user, status=JobStatus.FAILED, results=None)

    unfinished = client.post("/api/analysis-runs", {"job_id": job_id})
    empty = client.post("/api/analysis-runs", {"job_id": failed.pk})
    bad = client.post("/api/analysis-runs", {"job_id": "seven"})

    assert (unfinished.status_code, unfinished.json()["error"]) == (409, "job_not_finished")
    assert (empty.status_code, empty.json()["error"]) == (409, "nothing_to_save")
    assert (bad.status_code, bad.json()["error"]) == (422, "invalid_payload")
    assert run_writes() == 0 and not judge_jobs()


@pytest.mark.django_db
def test_runs_are_listed_newest_first(api):
    user = funded_user(credits=0)
    saved = [AnalysisJobFactory(user=user) for _ in range(3)]
    for job in saved:
        record(job, SavedBy.CLIENT)

    listed = api(user).get("/api/analysis-runs").json()

    assert [r["job_id"] for r in listed] == [j.pk for j in reversed(saved)]


@pytest.mark.django_db
def test_sweep_records_a_run_no_browser_saved_after_grace_and_once():
    job = AnalysisJobFactory()

    assert run_sweep("unsaved_runs").selected == 0
    past_grace(job.pk)
    first = run_sweep("unsaved_runs")
    second = run_sweep("unsaved_runs")

    assert (first.selected, first.changed, second.selected) == (1, 1, 0)
    run = AnalysisRun.objects.get()
    assert (run.pk, run.job_id, run.saved_by, run.version) == (job.run_id, job.pk, "worker", 1)
    assert [j["args"] for j in judge_jobs()] == [
        {"run_id": str(job.run_id), "version": 1, "tenant": job.tenant.slug}
    ]
    assert run_writes() == 1


@pytest.mark.django_db
def test_sweep_writes_nothing_when_the_client_saved_in_time():
    saved = [AnalysisJobFactory() for _ in range(19)]
    forgotten = AnalysisJobFactory()
    for job in saved:
        record(job, SavedBy.CLIENT)
    past_grace(*(j.pk for j in [*saved, forgotten]))

    tuples = run_tuples()

    result = run_sweep("unsaved_runs")

    assert (result.selected, result.changed) == (1, 1)
    assert run_writes() == 20
    assert {k: v for k, v in run_tuples().items() if k in tuples} == tuples


@pytest.mark.django_db
def test_sweep_skips_jobs_it_must_not_record():
    ignored = [
        AnalysisJobFactory(status=JobStatus.RUNNING),
        AnalysisJobFactory(status=JobStatus.CANCELLED),
        AnalysisJobFactory(doc_html=None),
        AnalysisJobFactory(results=None),
        AnalysisJobFactory(results={}),
        AnalysisJobFactory(deleted_at="2024-01-01T00:00:00Z"),
    ]
    past_grace(*(j.pk for j in ignored))

    assert run_sweep("unsaved_runs").selected == 0


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("first", "second", "winner", "version"),
    [
        (SavedBy.WORKER, SavedBy.CLIENT, "client", 2),
        (SavedBy.CLIENT, SavedBy.WORKER, "client", 1),
        (SavedBy.CLIENT, SavedBy.CLIENT, "client", 1),
        (SavedBy.WORKER, SavedBy.WORKER, "worker", 1),
    ],
)
def test_precedence_for_one_job(first, second, winner, version):
    job = AnalysisJobFactory()

    record(job, first)
    record(job, second)

    run = AnalysisRun.objects.get()
    assert (run.saved_by, run.version, run.job_id) == (winner, version, job.pk)
    assert len(judge_jobs()) == version


@pytest.mark.django_db
def test_a_run_ends_holding_its_newest_job_whoever_saves_in_whatever_order():
    """Newer job first, then client over worker; a stale save of an older job writes
    nothing, whoever makes it."""
    parent = AnalysisJobFactory()
    delta = AnalysisJobFactory(user=parent.user, run_id=parent.run_id, delta_of_job=parent)

    record(parent, SavedBy.WORKER)
    assert record(delta, SavedBy.WORKER) is True  # a later job replaces the row
    assert record(parent, SavedBy.WORKER) is False
    assert record(parent, SavedBy.CLIENT) is False  # a stale save: an old tab, say
    assert record(delta, SavedBy.CLIENT) is True  # same job: the client save wins
    assert record(delta, SavedBy.WORKER) is False
    assert record(parent, SavedBy.CLIENT) is False
    run = AnalysisRun.objects.get()
    assert (run.job_id, run.saved_by, run.version) == (delta.pk, "client", 3)


@pytest.mark.django_db
def test_a_stale_client_save_never_replaces_a_newer_recheck():
    """The reviewed fault: the delta's worker row was in place, the browser saved the
    older job, the sweep never re-recorded the delta and the trim deleted its body."""
    parent = AnalysisJobFactory()
    delta = AnalysisJobFactory(user=parent.user, run_id=parent.run_id, delta_of_job=parent)
    record(delta, SavedBy.WORKER)

    assert record(parent, SavedBy.CLIENT) is False
    assert AnalysisRun.objects.get().job_id == delta.pk
    past_grace(parent.pk, delta.pk)
    assert run_sweep("unsaved_runs").selected == 0  # both count as saved


@pytest.mark.django_db
def test_the_sweep_records_a_newer_job_over_any_older_row():
    parent = AnalysisJobFactory()
    delta = AnalysisJobFactory(user=parent.user, run_id=parent.run_id, delta_of_job=parent)
    record(parent, SavedBy.WORKER)
    past_grace(parent.pk, delta.pk)

    assert run_sweep("unsaved_runs").changed == 1
    assert AnalysisRun.objects.get().job_id == delta.pk

    # A client row of the older job does not hide the newer one either: the newer job
    # is not saved until its run holds it.
    other_parent = AnalysisJobFactory()
    other_delta = AnalysisJobFactory(
        user=other_parent.user, run_id=other_parent.run_id, delta_of_job=other_parent
    )
    record(other_parent, SavedBy.CLIENT)
    past_grace(other_delta.pk)
    assert run_sweep("unsaved_runs").changed == 1
    run = AnalysisRun.objects.get(pk=other_parent.run_id)
    assert (run.job_id, run.saved_by) == (other_delta.pk, "worker")


@pytest.mark.django_db
def test_a_legacy_row_counts_as_a_client_save():
    job = AnalysisJobFactory()
    AnalysisRun.objects.create(
        id=job.run_id,
        tenant=job.tenant,
        user=job.user,
        job=job,
        doc_html="legacy",
        results={"legacy": True},
        saved_by=None,
    )
    past_grace(job.pk)

    # A row written before the run_saved flag existed: the sweep meets the job once,
    # writes nothing, flags it, and never selects it again.
    first = run_sweep("unsaved_runs")
    assert (first.selected, first.changed) == (1, 0)
    assert AnalysisJob.objects.get(pk=job.pk).run_saved
    assert run_sweep("unsaved_runs").selected == 0
    assert record(job, SavedBy.WORKER) is False
    assert record(job, SavedBy.CLIENT) is False
    assert AnalysisRun.objects.get().doc_html == "legacy"


@pytest.mark.django_db
def test_a_run_that_names_no_job_counts_as_a_client_save_of_the_newest():
    """A legacy row, or one whose job was deleted (the foreign key sets it NULL): the
    sweep never overwrites it; a user's own save of a job of the run does."""
    job = AnalysisJobFactory()
    AnalysisRun.objects.create(
        id=job.run_id,
        tenant=job.tenant,
        user=job.user,
        job=None,
        doc_html="legacy",
        results={"legacy": True},
        saved_by=None,
    )
    past_grace(job.pk)

    sweep = run_sweep("unsaved_runs")
    assert (sweep.selected, sweep.changed) == (1, 0)  # met once, flagged, not written
    assert run_sweep("unsaved_runs").selected == 0
    assert AnalysisRun.objects.get().doc_html == "legacy"
    assert record(job, SavedBy.CLIENT) is True
    assert AnalysisRun.objects.get().job_id == job.pk


@pytest.mark.django_db
def test_each_recorded_version_is_judged_once():
    job = AnalysisJobFactory()
    record(job, SavedBy.WORKER)
    record(job, SavedBy.CLIENT)

    outcomes = [r.outcome for r in drain()]

    assert sorted(outcomes) == ["judged", "superseded"]
    judgement = RunJudgement.objects.get()
    assert (judgement.run_id, judgement.version) == (job.run_id, 2)
    assert judgement.summary["saved_by"] == "client"
    assert durability.analysis_run_judge(run_id=job.run_id, version=2) == "already_judged"
    assert durability.analysis_run_judge(run_id=uuid.uuid4(), version=1) == "missing"


@pytest.mark.django_db(transaction=True)
def test_client_saves_racing_the_sweep_end_with_one_client_row_each(clean_queue):
    batch = [AnalysisJobFactory() for _ in range(40)]
    past_grace(*(j.pk for j in batch))

    def race(i: int):
        if i == 0:
            return run_sweep("unsaved_runs")
        for job in batch[i - 1 :: 4]:
            durability.analysis_run_save(user=job.user, job_id=job.pk)
        return None

    results = run_concurrently(race, 5)

    assert not [r for r in results if isinstance(r, BaseException)], results
    runs = {r.pk: r for r in AnalysisRun.objects.all()}
    assert set(runs) == {j.run_id for j in batch}
    assert {r.saved_by for r in runs.values()} == {"client"}
    assert all(r.version in (1, 2) for r in runs.values())
    # Every written version has its judge job: nothing recorded goes unjudged.
    enqueued = {(j["args"]["run_id"], j["args"]["version"]) for j in judge_jobs()}
    assert enqueued >= {(str(r.pk), r.version) for r in runs.values()}


@pytest.mark.django_db(transaction=True)
def test_two_sweeps_at_once_record_each_missing_run_exactly_once(clean_queue):
    batch = [AnalysisJobFactory() for _ in range(120)]
    past_grace(*(j.pk for j in batch))

    def sweep(i: int) -> int:
        changed = 0
        while (result := run_sweep("unsaved_runs", batch_size=15)).selected:
            changed += result.changed
        return changed

    changed = run_concurrently(sweep, 2)

    assert sum(changed) == 120 and all(changed), changed
    assert AnalysisRun.objects.count() == 120
    assert set(AnalysisRun.objects.values_list("version", flat=True)) == {1}
    assert len(judge_jobs()) == 120


@pytest.mark.django_db
def test_trim_clears_old_saved_bodies_and_never_an_unsaved_one(settings, caplog):
    old_saved, old_unsaved, recent_saved = (AnalysisJobFactory() for _ in range(3))
    old_empty = AnalysisJobFactory(status=JobStatus.FAILED, results=None)
    parent = AnalysisJobFactory()
    old_delta = AnalysisJobFactory(user=parent.user, run_id=parent.run_id, delta_of_job=parent)
    record(old_saved, SavedBy.CLIENT)
    record(recent_saved, SavedBy.CLIENT)
    record(parent, SavedBy.WORKER)
    hours = settings.DOC_HTML_TRIM_HOURS
    backdate(
        "analysis_jobs",
        [old_saved.pk, old_unsaved.pk, old_empty.pk, old_delta.pk],
        seconds=(hours + 1) * 3600,
        columns=("finished_at",),
    )

    with caplog.at_level(logging.WARNING, logger="runs.durability"):
        result = run_sweep("doc_html_trim")

    bodies = dict(AnalysisJob.objects.values_list("pk", "doc_html"))
    assert bodies[old_saved.pk] is None and bodies[old_empty.pk] is None
    assert bodies[old_unsaved.pk] and bodies[recent_saved.pk] and bodies[old_delta.pk]
    assert (result.changed, result.notes["kept_unsaved"]) == (2, 2)
    assert "still lack their run" in caplog.text
    # The sweep rescues them; the next trim may then take their bodies.
    past_grace(old_unsaved.pk, old_delta.pk)
    assert run_sweep("unsaved_runs").changed == 2
    assert run_sweep("doc_html_trim").changed == 2


@pytest.mark.django_db
def test_sweep_select_uses_indexes_on_100k_jobs():
    user = funded_user(credits=0)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO analysis_jobs (tenant_id, user_id, run_id, status, title, doc_html,
                                       sources, results, error, release_attempts,
                                       created_at, updated_at, finished_at)
            SELECT %(tenant)s, %(user)s, gen_random_uuid(), 'complete', 'bulk',
                   CASE WHEN g %% 50 = 0 THEN '<p>body [k]</p>' END,
                   '[]', '{"verdicts": []}', '', 1,
                   now() - g * interval '1 minute', now() - g * interval '1 minute',
                   now() - g * interval '1 minute'
              FROM generate_series(1, 100000) AS g
            """,
            {"tenant": user.tenant_id, "user": user.pk},
        )
        cursor.execute(
            "INSERT INTO analysis_runs (id, tenant_id, user_id, job_id, title, saved_by,"
            " version, created_at, updated_at)"
            " SELECT run_id, tenant_id, user_id, id, title, 'client', 1, now(), now()"
            " FROM analysis_jobs WHERE id % 3 <> 0"
        )
        cursor.execute("ANALYZE analysis_jobs")
        cursor.execute("ANALYZE analysis_runs")
        cursor.execute("EXPLAIN " + queries["unsaved_runs"], {"grace_seconds": GRACE, "limit": 100})
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "analysis_jobs_unsaved_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
