"""POST /api/analysis-jobs: every check at click time, charge at admit, pending or
queued under the user's lock; refusals write nothing; foreign ids are 404."""

from __future__ import annotations

import pytest

from queueing.logs import tenant_of
from runs.models import AnalysisJob, CoreRun, CoreRunState, CreditEntry, CreditKind, JobStatus
from runs.processing import analysis_job_process
from runs.selectors import credit_balance
from tests.conftest import jobs
from tests.factories import TenantFactory, UserFactory
from tests.runs.factories import funded_user, payload

pytestmark = pytest.mark.django_db


def test_first_admit_is_pending_with_its_process_job_and_later_ones_queue_in_order(api):
    user = funded_user(credits=5)
    client = api(user)

    answers = [client.post("/api/analysis-jobs", payload(title=f"T{i}")) for i in range(3)]

    assert [a.status_code for a in answers] == [201, 201, 201]
    bodies = [a.json() for a in answers]
    assert [(b["status"], b["queue_position"]) for b in bodies] == [
        ("pending", 0),
        ("queued", 1),
        ("queued", 2),
    ]
    assert len({b["run_id"] for b in bodies}) == 3
    enqueued = jobs(task_name="runs.process_job")
    # The tenant's slug rides along, for the job's log lines.
    assert [j["args"] for j in enqueued] == [
        {"job_id": bodies[0]["id"], "tenant": user.tenant.slug}
    ]
    assert tenant_of(key=enqueued[0]["queueing_lock"], task_kwargs=enqueued[0]["args"]) == (
        user.tenant.slug
    )
    assert enqueued[0]["queueing_lock"] == f"exclusive/analysis:{bodies[0]['id']}"
    assert credit_balance(user_id=user.pk) == 2
    assert set(CoreRun.objects.values_list("state", flat=True)) == {CoreRunState.HELD}


def test_get_job_shows_queue_position_then_verdicts_once_complete(api):
    user = funded_user(credits=5)
    client = api(user)
    first = client.post("/api/analysis-jobs", payload()).json()
    second = client.post("/api/analysis-jobs", payload()).json()

    assert client.get(f"/api/analysis-jobs/{second['id']}").json()["queue_position"] == 1
    analysis_job_process(job_id=first["id"])

    done = client.get(f"/api/analysis-jobs/{first['id']}").json()
    assert done["status"] == "complete"
    assert [v["source_key"] for v in done["verdicts"]] == ["thermo", "moon", "thermo"]
    assert done["summary"]["citations"] == 3
    promoted = client.get(f"/api/analysis-jobs/{second['id']}").json()
    assert (promoted["status"], promoted["queue_position"]) == ("pending", 0)
    listed = client.get("/api/analysis-jobs").json()
    assert [j["id"] for j in listed] == [second["id"], first["id"]]


def test_short_credits_answer_402_and_write_nothing(api, table_counts):
    user = funded_user(credits=0)
    before = table_counts()

    answer = api(user).post("/api/analysis-jobs", payload())

    assert answer.status_code == 402
    assert answer.json()["error"] == "insufficient_credits"
    assert table_counts() == before


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (payload(sources=[]), 422, "no_sources"),
        (payload(sources=[{"key": "a", "doi": "doi:10.1/x"}]), 422, "invalid_doi"),
        (payload(sources=[{"key": "a", "doi": "10.12/short"}]), 422, "invalid_doi"),
        (payload(doc_html="<p>no citations here</p>"), 422, "no_citations"),
        (payload(title=""), 422, "invalid_payload"),
        (payload(title="   "), 422, "invalid_payload"),
        (payload(doc_html=""), 422, "invalid_payload"),
        (payload(sources=[{"key": "a"}, {"key": "a"}]), 422, "invalid_payload"),
        (payload(sources=[{"key": "a"}, {"key": "A"}]), 422, "invalid_payload"),
        (payload(sources=[{"key": "has space"}]), 422, "invalid_payload"),
        (payload(sources="thermo"), 422, "invalid_payload"),
        (payload(delta_of_job_id=0), 422, "invalid_payload"),
        (payload(delta_of_job_id=2**63), 422, "invalid_payload"),
        (payload(unexpected=True), 422, "invalid_payload"),
        ({"title": "no document"}, 422, "invalid_payload"),
    ],
)
def test_bad_input_is_a_4xx_json_error_and_writes_nothing(api, table_counts, body, status, code):
    client = api(funded_user(credits=3))
    before = table_counts()

    answer = client.post("/api/analysis-jobs", body)

    assert answer.status_code == status, answer.content
    assert answer.json()["error"] == code
    assert table_counts() == before


def test_malformed_json_is_a_4xx_and_writes_nothing(api, table_counts):
    client = api(funded_user(credits=3))
    before = table_counts()

    answer = client.client.post(
        "/api/analysis-jobs", "{not json", content_type="application/json", headers=client.headers
    )

    assert 400 <= answer.status_code < 500
    assert "error" in answer.json()
    assert table_counts() == before


def test_exhausted_core_budget_is_429_and_gives_nothing_away(api, settings, table_counts):
    settings.CORE_DAILY_BUDGET = 1
    client = api(funded_user(credits=3))
    assert client.post("/api/analysis-jobs", payload()).status_code == 201
    before = table_counts()

    answer = client.post("/api/analysis-jobs", payload())

    assert answer.status_code == 429
    assert answer.json()["error"] == "budget_exhausted"
    assert table_counts() == before


def test_unreachable_core_at_admission_is_503_and_writes_nothing(api, settings, table_counts):
    client = api(funded_user(credits=3))
    settings.CORE_AVAILABLE = False
    before = table_counts()

    answer = client.post("/api/analysis-jobs", payload())

    assert answer.status_code == 503
    assert answer.json()["error"] == "core_unavailable"
    assert table_counts() == before


def test_delta_of_a_complete_job_shares_its_run_and_starts_despite_a_queue(api):
    user = funded_user(credits=10)
    client = api(user)
    parent = client.post("/api/analysis-jobs", payload()).json()
    analysis_job_process(job_id=parent["id"])
    blocking = [client.post("/api/analysis-jobs", payload()).json() for _ in range(3)]
    assert [b["status"] for b in blocking] == ["pending", "queued", "queued"]

    delta = client.post("/api/analysis-jobs", payload(delta_of_job_id=parent["id"])).json()

    assert (delta["status"], delta["queue_position"]) == ("pending", 0)
    assert delta["run_id"] == parent["run_id"]
    assert CreditEntry.objects.filter(job_id=delta["id"], kind=CreditKind.CHARGE).count() == 1


def test_delta_of_an_unfinished_job_is_409(api, table_counts):
    client = api(funded_user(credits=10))
    parent = client.post("/api/analysis-jobs", payload()).json()
    before = table_counts()

    answer = client.post("/api/analysis-jobs", payload(delta_of_job_id=parent["id"]))

    assert answer.status_code == 409
    assert answer.json()["error"] == "parent_not_complete"
    assert table_counts() == before


def test_foreign_ids_are_404_for_reads_saves_and_deltas(api):
    owner = funded_user(credits=5)
    job = api(owner).post("/api/analysis-jobs", payload()).json()
    analysis_job_process(job_id=job["id"])
    neighbour = funded_user(credits=5, tenant=owner.tenant)
    stranger = funded_user(credits=5, tenant=TenantFactory())

    for other in (neighbour, stranger):
        client = api(other)
        assert client.get(f"/api/analysis-jobs/{job['id']}").status_code == 404
        assert client.post("/api/analysis-runs", {"job_id": job["id"]}).status_code == 404
        delta = client.post("/api/analysis-jobs", payload(delta_of_job_id=job["id"]))
        assert (delta.status_code, delta.json()["error"]) == (404, "not_found")
        assert client.get("/api/analysis-jobs").json() == []
        assert client.get("/api/analysis-runs").json() == []
    assert AnalysisJob.objects.count() == 1


def test_missing_ids_and_unauthenticated_calls_are_4xx(api):
    client = api(funded_user())

    assert client.get("/api/analysis-jobs/999999").status_code == 404
    assert client.get(f"/api/analysis-jobs/{2**63}").status_code == 422
    assert api(None).get("/api/analysis-jobs/1").status_code == 401
    assert api(None).post("/api/analysis-jobs", payload()).status_code == 401


def test_a_user_without_tenant_cannot_use_the_api(api):
    user = UserFactory(tenant=None)

    assert api(user).post("/api/analysis-jobs", payload()).status_code == 401
    assert not AnalysisJob.objects.filter(status=JobStatus.PENDING).exists()


def test_an_admit_is_two_statements():
    """The user's lock, and one statement that checks, creates the held core run, inserts,
    charges and enqueues the started job's process_job: nothing more."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from runs.admission import analysis_job_admit
    from tests.runs.factories import DOC_HTML, SOURCES

    user = funded_user(credits=5)

    def admit():
        with CaptureQueriesContext(connection) as captured:
            admitted = analysis_job_admit(user=user, title="t", doc_html=DOC_HTML, sources=SOURCES)
        sql = [q["sql"] for q in captured if "SAVEPOINT" not in q["sql"].upper()]
        return admitted, sql

    first, pending_sql = admit()
    second, queued_sql = admit()
    assert (first.status, second.status, second.queue_position) == ("pending", "queued", 1)
    assert len(pending_sql) == 2, pending_sql  # lock, admit (held run, job, charge, enqueue)
    assert len(queued_sql) == 2, queued_sql
    assert [j["args"]["job_id"] for j in jobs(task_name="runs.process_job")] == [first.id]


def test_a_refused_admit_writes_nothing_not_even_a_held_run(api, table_counts, settings):
    """The held run is created by the admission's own statement, only once its checks
    passed; a refusal under the lock (here the bound on open analyses) writes nothing: no
    held run, no budget unit, no job, no charge."""
    settings.MAX_QUEUED_ANALYSES_PER_USER = 1
    user = funded_user(credits=5)
    client = api(user)
    assert client.post("/api/analysis-jobs", payload()).status_code == 201
    before = table_counts()

    answer = client.post("/api/analysis-jobs", payload())

    assert answer.status_code == 429 and answer.json()["error"] == "queue_full"
    assert table_counts() == before


def test_a_held_run_no_admission_took_is_cancelled_by_the_resume_tick(table_counts, settings):
    """An admission that died after creating its held run and before committing its job:
    the resume tick cancels the run and gives the tenant's budget unit back."""
    from django.db import connection

    from queueing.sweeps import run_sweep
    from runs.core import get_core
    from tests.runs.factories import SOURCES

    user = funded_user(credits=5)
    before = table_counts()
    orphan = get_core().create_held(
        run_id=__import__("uuid").uuid4(), user_id=user.pk, sources=SOURCES
    )
    assert table_counts() != before
    assert run_sweep("analysis_resume").notes["held_expired"] == 0  # too young to judge
    # Past the expiry by seconds, not an hour: the budget unit goes back to the day it
    # was taken from, which an hour's back-dating would move across midnight.
    settings.CORE_HELD_EXPIRY_SECONDS = 5
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE core_runs SET created_at = created_at - interval '6 seconds' WHERE id = %s",
            [orphan],
        )
    assert run_sweep("analysis_resume").notes["held_expired"] == 1
    assert table_counts() == before
    assert run_sweep("analysis_resume").notes["held_expired"] == 0


@pytest.mark.django_db(transaction=True)
def test_an_admit_is_one_round_trip_on_the_wire(clean_queue):
    """Counted on the wire (BEGIN and COMMIT included): the user's lock, the statement and
    the COMMIT travel together, whether the job starts or queues."""
    from runs.admission import analysis_job_admit
    from tests.queueing.test_round_trips import round_trips
    from tests.runs.factories import DOC_HTML, SOURCES

    user = funded_user(credits=5)

    def admit():
        return analysis_job_admit(user=user, title="t", doc_html=DOC_HTML, sources=SOURCES)

    first, n_first = round_trips(admit)
    second, n_second = round_trips(admit)
    assert (first.status, n_first) == ("pending", 1)
    assert (second.status, second.queue_position, n_second) == ("queued", 1, 1)
