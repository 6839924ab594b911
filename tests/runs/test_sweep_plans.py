"""The resume tick reads what it may act on, not the history around it, whatever the
statistics say. Its search for lost ``process_job`` tasks (``lost_process_jobs``) probes
the EXCLUSIVE key's partial unique index once per active job: it never scans the waiting
jobs (nor, with stale statistics, the whole table and its dead rows) to find that nothing
is lost. Its held-run expiry reads the unfinished core runs through their partial index,
never every run ever made, and asks whether a job references a held run with one probe
per run, never a hash of every job that ever had one. Checked on the plans (their shape,
not their time), with the tables never analysed and after ANALYZE, beside 5,000 finished
jobs or core runs (20,000 jobs with their runs, most of them deleted, for the probe)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from queueing.enqueue import Policy, queueing_lock_prefix
from queueing.planner import WALK_SETTINGS
from runs import admission
from runs.core import queries
from runs.queue import PROCESS_JOB_KEY
from tests.plans import rows_read
from tests.runs.factories import DOC_HTML, SOURCES, backdate, funded_user

INDEX = "pgstage_jobs_exclusive_key"
UNFINISHED_RUNS = {"core_runs_unfinished_idx"}


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def plan_of_lost_process_jobs() -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(WALK_SETTINGS)  # as it runs (queueing.planner), in the test's transaction
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + queries["lost_process_jobs"],
            {
                "cutoff": timezone.now() - datetime.timedelta(seconds=60),
                "lock_prefix": queueing_lock_prefix(PROCESS_JOB_KEY, Policy.EXCLUSIVE),
                "limit": 500,
            },
        )
        (document,) = cursor.fetchone()
    if isinstance(document, str):
        document = json.loads(document)
    return list(nodes(document[0]["Plan"]))


def jobs_scans(plan: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [
        (node["Node Type"], node.get("Index Name"))
        for node in plan
        if node.get("Relation Name") == "procrastinate_jobs"
    ]


@pytest.fixture
def idle_active_jobs():
    ids = []
    for _ in range(3):
        user = funded_user(credits=3)
        for _ in range(3):  # one active (its process_job waiting), two queued
            ids.append(
                admission.analysis_job_admit(
                    user=user, title="T", doc_html=DOC_HTML, sources=SOURCES
                ).id
            )
    backdate("analysis_jobs", ids, seconds=3600)
    with connection.cursor() as cursor:  # the finished jobs of a queue that has run a while
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args)"
            " SELECT 'finished', 'noop', 'succeeded', '{}' FROM generate_series(1, 5000)"
        )
    return ids


@pytest.mark.django_db
@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_lost_process_jobs_probes_the_exclusive_key_index_per_job(idle_active_jobs, analyzed):
    if analyzed:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE procrastinate_jobs")
            cursor.execute("ANALYZE analysis_jobs")
    (scan,) = jobs_scans(plan_of_lost_process_jobs())
    assert scan in {("Index Scan", INDEX), ("Index Only Scan", INDEX)}


@pytest.fixture
def finished_core_runs():
    """The finished core runs of a site that has run a while (the sweep must not read them)."""
    user = funded_user(credits=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO core_runs (run_id, user_id, state, sources, error, created_at)"
            " SELECT gen_random_uuid(), %s, 'done', '[]', '', now() - interval '1 day'"
            " FROM generate_series(1, 5000)",
            [user.pk],
        )


@pytest.mark.django_db
@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
@pytest.mark.parametrize("name", ["core_stale_held", "core_abandoned_released"])
def test_the_held_run_sweeps_read_only_unfinished_core_runs(finished_core_runs, analyzed, name):
    """The resume tick's held-run expiry reads the held (and released or judging) core
    runs through their partial index, never every run ever made."""
    with connection.cursor() as cursor:
        if analyzed:
            cursor.execute("ANALYZE core_runs")
        cursor.execute("EXPLAIN (FORMAT JSON) " + queries[name], {"seconds": 60, "limit": 500})
        (document,) = cursor.fetchone()
    if isinstance(document, str):
        document = json.loads(document)
    plan = list(nodes(document[0]["Plan"]))
    reads = [n for n in plan if n.get("Relation Name") == "core_runs" and "Scan" in n["Node Type"]]
    assert not [n for n in reads if n["Node Type"] == "Seq Scan"], reads
    # A run is found through the partial index; the primary key only fetches one by id.
    assert UNFINISHED_RUNS & {n.get("Index Name") for n in plan}, plan
    assert all("Index Cond" in n for n in reads if n.get("Index Name") == "core_runs_pkey"), reads


@pytest.fixture
def held_runs_beside_history():
    """300 held core runs (admissions in flight, none referenced yet) beside finished
    analysis jobs, each with its finished core run. Most of that history then deleted and
    not yet vacuumed (a tenant purged): the statistics see few jobs with a run, the index
    still holds them all."""
    user = funded_user(credits=0)
    params = {"user": user.pk, "tenant": user.tenant_id}
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO core_runs (run_id, user_id, state, sources, error, created_at)"
            " SELECT gen_random_uuid(), %(user)s, 'held', '[]', '', now()"
            "   FROM generate_series(1, 300)",
            params,
        )
        cursor.execute(
            "WITH runs AS (INSERT INTO core_runs (run_id, user_id, state, sources, error,"
            "                                     created_at)"
            "  SELECT gen_random_uuid(), %(user)s, 'done', '[]', '', now() - interval '1 day'"
            "    FROM generate_series(1, 20000) RETURNING id, run_id)"
            " INSERT INTO analysis_jobs (tenant_id, user_id, run_id, core_run_id, status,"
            "        title, sources, error, release_attempts, requeues, run_saved,"
            "        created_at, updated_at)"
            " SELECT %(tenant)s, %(user)s, run_id, id, 'complete', 'h', '[]', '', 0, 0, true,"
            "        now() - interval '1 day', now() - interval '1 day' FROM runs",
            params,
        )
        cursor.execute("ANALYZE analysis_jobs")
        cursor.execute("ANALYZE core_runs")
        cursor.execute("DELETE FROM analysis_jobs WHERE id % 100 <> 0")
        cursor.execute("ANALYZE analysis_jobs")


@pytest.mark.django_db
def test_the_held_run_expiry_probes_a_held_runs_jobs_never_the_history(held_runs_beside_history):
    """Whether any job references a held run is one index probe per held run: never a
    hashed subplan that reads every job that ever had a run (the planner's pick for an
    EXISTS under an OR, at these statistics), nor a scan of the table."""
    with connection.cursor() as cursor:
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + queries["core_stale_held"], {"seconds": 60, "limit": 500}
        )
        (document,) = cursor.fetchone()
    if isinstance(document, str):
        document = json.loads(document)
    plan = list(nodes(document[0]["Plan"]))
    assert not [n for n in plan if "hashed SubPlan" in n.get("Filter", "")], plan
    jobs = [n for n in plan if n.get("Relation Name") == "analysis_jobs"]
    assert jobs and not [n for n in jobs if n["Node Type"] == "Seq Scan"], jobs
    probes = [
        n
        for sub in plan
        if sub.get("Parent Relationship") == "SubPlan"
        for n in nodes(sub)
        if n.get("Relation Name") == "analysis_jobs"
    ]
    assert probes and all(
        "(core_run_id = c.id)" in (n.get("Index Cond", "") + n.get("Recheck Cond", ""))
        for n in probes
    ), probes


@pytest.mark.django_db
def test_lost_process_jobs_finds_only_the_jobs_whose_task_is_gone():
    """Waiting, retrying (waiting, scheduled later) and running tasks keep their job;
    a task that ended, or none at all, leaves it lost. Whatever the plan, the answer."""
    ids = [
        admission.analysis_job_admit(
            user=funded_user(credits=1), title="T", doc_html=DOC_HTML, sources=SOURCES
        ).id
        for _ in range(5)
    ]
    waiting, retrying, running, ended, gone = ids
    lock = queueing_lock_prefix(PROCESS_JOB_KEY, Policy.EXCLUSIVE)
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE procrastinate_jobs SET scheduled_at = now() + interval '1 hour',"
            " attempts = 1 WHERE queueing_lock = %s",
            [f"{lock}{retrying}"],
        )
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'doing' WHERE queueing_lock = %s",
            [f"{lock}{running}"],
        )
        cursor.execute(
            "UPDATE procrastinate_jobs SET status = 'failed' WHERE queueing_lock = %s",
            [f"{lock}{ended}"],
        )
        cursor.execute("DELETE FROM procrastinate_jobs WHERE queueing_lock = %s", [f"{lock}{gone}"])
        cursor.execute("UPDATE analysis_jobs SET status = 'running' WHERE id = ANY(%s)", [ids])
    backdate("analysis_jobs", ids, seconds=3600)
    with connection.cursor() as cursor:
        cursor.execute(
            queries["lost_process_jobs"],
            {
                "cutoff": timezone.now() - datetime.timedelta(seconds=60),
                "lock_prefix": lock,
                "limit": 500,
            },
        )
        assert sorted(row[0] for row in cursor.fetchall()) == sorted([ended, gone])
    assert waiting


def plan_of_resume_work() -> list[dict[str, Any]]:
    with connection.cursor() as cursor:
        cursor.execute(WALK_SETTINGS)
        cursor.execute(
            "EXPLAIN (FORMAT JSON) " + queries["resume_work"],
            {
                "idle_seconds": 60,
                "held_seconds": 600,
                "lock_prefix": queueing_lock_prefix(PROCESS_JOB_KEY, Policy.EXCLUSIVE),
            },
        )
        (document,) = cursor.fetchone()
    if isinstance(document, str):
        document = json.loads(document)
    return list(nodes(document[0]["Plan"]))


HISTORY = {"analysis_jobs", "procrastinate_jobs", "core_runs"}
LIVE_INDEXES = {"analysis_jobs_live_idx", "core_runs_unfinished_idx"}


@pytest.mark.django_db
@pytest.mark.parametrize("analyzed", [False, True], ids=["stale-statistics", "analyzed"])
def test_the_resume_probe_reads_live_rows_and_probes_the_rest_per_row(
    held_runs_beside_history, idle_active_jobs, analyzed
):
    """The resume tick's probe (``resume_work``) beside a history of jobs, core runs and
    finished procrastinate jobs, most of it purged: its passes read the queued and active
    jobs and the unfinished core runs through their partial indexes, and everything it
    asks of those tables (an active sibling, a process_job's key, a run's jobs) is one
    index probe per row, never a hash or a scan of the history."""
    if analyzed:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE analysis_jobs, core_runs, procrastinate_jobs")
    plan = plan_of_resume_work()
    reads = [n for n in plan if n.get("Relation Name") in HISTORY]
    assert not [n for n in reads if n["Node Type"] == "Seq Scan"], reads
    assert not [n for n in plan if "hashed SubPlan" in n.get("Filter", "")], plan
    assert {n.get("Index Name") for n in plan} >= LIVE_INDEXES, plan
    probes = [
        n
        for sub in plan
        if sub.get("Parent Relationship") == "SubPlan"
        for n in nodes(sub)
        if n.get("Relation Name") in HISTORY and "Scan" in n["Node Type"]
    ]
    assert probes and all(
        ("Index Cond" in n or "Recheck Cond" in n)
        and any(
            f"{outer}." in n.get("Index Cond", "") + n.get("Recheck Cond", "")
            for outer in ("q", "w", "j", "c")
        )
        for n in probes
    ), probes


#: What the planner was last told when a backlog arrives (as in tests/queueing/test_fetch.py):
#: statistics taken with the backlog there; taken while the table held only finished jobs;
#: and besides, the table vacuumed after most of those were deleted (a few dozen rows).
STATISTICS = ["fresh", "finished only", "vacuumed quiet"]


def _active_jobs_beside_a_backlog(statistics: str) -> None:
    """3 users, each with an active analysis (its process_job waiting) idle for an hour
    and two queued behind it, beside 3,000 waiting jobs of other tasks (half of them with
    EXCLUSIVE keys of their own) and 5,000 finished analyses, under ``statistics``."""
    history = funded_user(credits=0)
    with connection.cursor() as cursor:
        cursor.execute(
            "WITH runs AS (INSERT INTO core_runs (run_id, user_id, state, sources, error,"
            "                                     created_at)"
            "  SELECT gen_random_uuid(), %(user)s, 'done', '[]', '', now() - interval '1 day'"
            "    FROM generate_series(1, 5000) RETURNING id, run_id)"
            " INSERT INTO analysis_jobs (tenant_id, user_id, run_id, core_run_id, status,"
            "        title, sources, error, release_attempts, requeues, run_saved,"
            "        created_at, updated_at)"
            " SELECT %(tenant)s, %(user)s, run_id, id, 'complete', 'h', '[]', '', 0, 0, true,"
            "        now() - interval '1 day', now() - interval '1 day' FROM runs",
            {"user": history.pk, "tenant": history.tenant_id},
        )
        if statistics != "fresh":
            cursor.execute(
                "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args)"
                " SELECT 'default', 'other.task', 'succeeded', '{}'"
                "   FROM generate_series(1, 20000)"
            )
            cursor.execute("ANALYZE procrastinate_jobs, analysis_jobs")
        if statistics == "vacuumed quiet":
            cursor.execute("DELETE FROM procrastinate_jobs WHERE id % 250 <> 0")
            cursor.execute("VACUUM procrastinate_jobs")
        cursor.execute(
            "INSERT INTO procrastinate_jobs (queue_name, task_name, status, args, queueing_lock)"
            " SELECT 'default', 'other.task', 'todo', '{}',"
            "        CASE WHEN g % 2 = 0 THEN 'exclusive/other.task/' || g END"
            "   FROM generate_series(1, 3000) AS g"
        )
    ids = []
    for _ in range(3):
        user = funded_user(credits=3)
        for _ in range(3):
            ids.append(
                admission.analysis_job_admit(
                    user=user, title="T", doc_html=DOC_HTML, sources=SOURCES
                ).id
            )
    backdate("analysis_jobs", ids, seconds=3600)
    if statistics == "fresh":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE procrastinate_jobs, analysis_jobs")


@pytest.mark.parametrize("statistics", STATISTICS)
def test_the_lost_job_search_reads_only_the_active_jobs_keys(clean_queue, statistics):
    """The resume tick asks each active analysis whether its process_job still holds its
    EXCLUSIVE key (``lost_process_jobs``, and the probe ``resume_work`` runs every tick):
    one probe of that key per active job, never a walk of the other waiting jobs. Before:
    the planner's pick under stale statistics walked procrastinate's index of every
    waiting or running job for each active analysis (9,006 rows read for 3 of them)."""
    _active_jobs_beside_a_backlog(statistics)
    lock_prefix = queueing_lock_prefix(PROCESS_JOB_KEY, Policy.EXCLUSIVE)
    lost_params = {
        "cutoff": timezone.now() - datetime.timedelta(seconds=60),
        "lock_prefix": lock_prefix,
        "limit": 500,
    }
    probe_params = {"idle_seconds": 60, "held_seconds": 600, "lock_prefix": lock_prefix}
    # The plan for these parameters, and the generic plan a prepared statement settles on
    # (Django's connection prepares where its OPTIONS say so).
    for generic in (False, True):
        lost = rows_read(
            queries["lost_process_jobs"],
            lost_params,
            settings=WALK_SETTINGS,
            generic=generic,
            relation="procrastinate_jobs",
        )
        probe = rows_read(
            queries["resume_work"],
            probe_params,
            settings=WALK_SETTINGS,
            generic=generic,
            relation="procrastinate_jobs",
        )
        # One entry per active analysis: its process_job's.
        assert lost <= 3, repr(lost)
        assert probe <= 3, repr(probe)
