"""No response is unbounded: lists are paged by cursor (the ``Link`` header names the
next page) and the parts of a detail that grow (an inquiry's positions and warnings, a
job's verdicts) come a page at a time.

Fault model:

* rows are inserted while a client pages: no row is skipped or repeated
  (``test_a_list_pages_stably_while_rows_are_inserted``, for every list);
* an inquiry with thousands of positions, a job with hundreds of citations: the detail
  carries the first page and the URL of the rest
  (``test_an_inquirys_positions_come_a_page_at_a_time``,
  ``test_a_jobs_verdicts_come_a_page_at_a_time``);
* a cursor handed to another tenant's user reads only their own rows
  (``test_a_cursor_reads_only_the_callers_rows``);
* a forged cursor — a value of another type (float, bool, null, list), out of range
  (2**63, -1, 0), or not in the form the API writes (a NUL, another date or UUID
  spelling): 400 ``invalid_cursor`` on every list, never a 500 and never rows
  (``test_every_list_answers_400_to_a_forged_cursor``).
"""

from __future__ import annotations

import base64
import json
import re

import pytest
from django.test import Client

from pipeline.models import Anfrage
from runs import durability, processing
from runs.admission import analysis_job_admit
from runs.credits import credit_grant
from runs.models import SavedBy
from tests.factories import TenantFactory, UserFactory, auth_header
from tests.pipeline.conftest import run_stages, submit
from tests.runs.factories import DOC_HTML, SOURCES

pytestmark = pytest.mark.django_db


def next_link(response) -> str | None:
    match = re.fullmatch(r'<([^>]+)>; rel="next"', response.get("Link", ""))
    return match.group(1) if match else None


def read_all(client: Client, url: str, headers: dict, between=None) -> list[dict]:
    """Every item of a list, page by page (``between()`` runs after each page)."""
    items = []
    while url:
        response = client.get(url, headers=headers)
        assert response.status_code == 200, response.content
        items.extend(response.json())
        url = next_link(response)
        if between is not None:
            between()
    return items


def make_job(user, n: int) -> None:
    admitted = analysis_job_admit(user=user, title=f"T{n}", doc_html=DOC_HTML, sources=SOURCES)
    processing.analysis_job_process(job_id=admitted.id)
    durability.analysis_run_record(job_id=admitted.id, saved_by=SavedBy.CLIENT)


@pytest.mark.parametrize(
    ("path", "make"),
    [
        ("/api/anfragen", lambda user, n: submit(user.tenant, {f"f{n}.txt": "1 pcs beam\n"})),
        ("/api/analysis-jobs", make_job),
        ("/api/analysis-runs", make_job),
    ],
    ids=["anfragen", "analysis-jobs", "analysis-runs"],
)
def test_a_list_pages_stably_while_rows_are_inserted(settings, user, path, make):
    settings.MAX_QUEUED_ANALYSES_PER_USER = 0
    for n in range(7):
        make(user, n)
    headers = auth_header(user)
    client = Client()
    first = read_all(client, path, headers)
    counter = iter(range(100, 200))

    paged = read_all(client, f"{path}?limit=3", headers, between=lambda: make(user, next(counter)))

    ids = [item["id"] for item in paged]
    # The pages hold exactly the rows there were when paging began, newest first; the
    # rows inserted meanwhile are newer and would be on a fresh first page.
    assert ids == [item["id"] for item in first]
    assert len(ids) == len(set(ids)) == 7
    assert len(client.get(path, headers=headers).json()) == 7 + 3


def test_an_inquirys_positions_come_a_page_at_a_time(user):
    lines = "".join(f"{n + 1} pcs steel beam HEA 200, 6 m\n" for n in range(250))
    lines += "".join(f"nonsense {n}\n" for n in range(120))
    anfrage = submit(user.tenant, {"items.txt": lines})
    run_stages(anfrage.id)
    client, headers = Client(), auth_header(user)

    detail = client.get(f"/api/anfragen/{anfrage.id}", headers=headers).json()
    positions = detail["positions"] + read_all(client, detail["positions_next"], headers)
    warnings = detail["warnings"] + read_all(client, detail["warnings_next"], headers)

    assert len(detail["positions"]) == 100 and len(detail["warnings"]) == 100
    assert [p["index"] for p in positions] == list(range(1, 251))
    assert [w["line_no"] for w in warnings] == list(range(251, 371))
    small = submit(user.tenant, {"few.txt": "1 pcs beam\n"})
    run_stages(small.id)
    few = client.get(f"/api/anfragen/{small.id}", headers=headers).json()
    assert few["positions_next"] is None and few["warnings_next"] is None


def test_a_jobs_verdicts_come_a_page_at_a_time(user):
    doc = "<p>" + "".join(f"Water boils at sea level number {n} [thermo]. " for n in range(130))
    admitted = analysis_job_admit(user=user, title="T", doc_html=doc + "</p>", sources=SOURCES)
    processing.analysis_job_process(job_id=admitted.id)
    client, headers = Client(), auth_header(user)

    detail = client.get(f"/api/analysis-jobs/{admitted.id}", headers=headers).json()
    verdicts = detail["verdicts"] + read_all(client, detail["verdicts_next"], headers)

    assert len(detail["verdicts"]) == 100
    assert [v["marker"] for v in verdicts] == [f"c{n}" for n in range(1, 131)]
    assert detail["summary"]["citations"] == 130


def test_a_cursor_reads_only_the_callers_rows(user):
    for n in range(3):
        submit(user.tenant, {f"f{n}.txt": "1 pcs beam\n"})
    mallory = UserFactory(username="mallory", tenant=TenantFactory(slug="globex"))
    credit_grant(user_id=mallory.pk, amount=1)
    theirs = submit(mallory.tenant, {"t.txt": "1 pcs beam\n"})
    client = Client()
    first = client.get("/api/anfragen?limit=1", headers=auth_header(user))

    borrowed = client.get(next_link(first), headers=auth_header(mallory))

    assert borrowed.status_code == 200
    assert [a["id"] for a in borrowed.json()] == (
        [theirs.id] if theirs.id < first.json()[0]["id"] else []
    )
    assert Anfrage.objects.count() == 4


def cursor_of(values: list) -> str:
    return base64.urlsafe_b64encode(json.dumps(values).encode()).decode().rstrip("=")


UUID_TEXT = "0b9e6d0e-6f0a-4c8e-9d0e-1b2c3d4e5f60"
DATE = "2026-01-01T00:00:00+00:00"
#: Forged values for a list ordered by (created_at, id) — id an integer or a UUID —
#: each of a wrong type, out of range or not in the form the API writes.
FORGED_PAIRS = [
    [DATE, 1.5],
    [DATE, True],
    [DATE, 2**63],
    [DATE, -1],
    [DATE, 0],
    [DATE, None],
    [DATE, [1]],
    [DATE, {"a": 1}],
    [DATE, "1"],
    [DATE, UUID_TEXT.upper()],
    [DATE, "{" + UUID_TEXT + "}"],
    [DATE, UUID_TEXT + "\x00"],
    ["2026-01-01T00:00:00\x00+00:00", 1],
    ["2026-01-01\x0000:00:00+00:00", 1],
    ["2026-01-01 00:00:00+00:00", 1],
    ["2026-01-01T00:00:00Z", 1],
    ["2026-01-01T00:00:00", 1],
    ["0001-01-01T00:00:00-23:59", 1],
    [1.5, 1],
    [True, 1],
    [None, None],
]
#: Forged values for a list ordered by one integer column.
FORGED_SINGLES = [[1.5], [True], [2**63], [-1], [0], ["1"], [None], [[1]], ["\x00"], [1e308]]


def forged_cases():
    pairs = ["/api/anfragen", "/api/analysis-jobs", "/api/analysis-runs"]
    singles = [
        "/api/anfragen/{anfrage}/positions",
        "/api/anfragen/{anfrage}/warnings",
        "/api/analysis-jobs/{job}/verdicts",
    ]
    for path in pairs:
        for values in FORGED_PAIRS:
            yield pytest.param(path, values, id=f"{path}-{values!r}")
    for path in singles:
        for values in FORGED_SINGLES:
            yield pytest.param(path, values, id=f"{path}-{values!r}")


@pytest.mark.parametrize(("path", "values"), list(forged_cases()))
def test_every_list_answers_400_to_a_forged_cursor(user, path, values):
    anfrage = submit(user.tenant, {"f.txt": "1 pcs beam\n"})
    job = analysis_job_admit(user=user, title="T", doc_html=DOC_HTML, sources=SOURCES)
    url = path.format(anfrage=anfrage.id, job=job.id)

    response = Client().get(f"{url}?cursor={cursor_of(values)}", headers=auth_header(user))

    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid_cursor"
