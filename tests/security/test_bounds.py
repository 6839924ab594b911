"""Bounds per user and per tenant (OWASP API4): each is configurable, answered with a clear
429 (and ``Retry-After`` where the wait is known), writes nothing when it refuses, and
holds under concurrency.

Fault model:

* a user clicks "analyse" in a loop: ``MAX_QUEUED_ANALYSES_PER_USER`` open jobs at most,
  also when the clicks race (``test_a_users_open_analyses_are_bounded``,
  ``test_the_bound_holds_when_admits_race``);
* a tenant's integration submits inquiries in a loop: ``MAX_INQUIRIES_PER_TENANT_PER_HOUR``
  per rolling hour, refused before the upload is read, also when submits race
  (``test_a_tenants_inquiries_per_hour_are_bounded``,
  ``test_the_hourly_bound_holds_when_submits_race``);
* one tenant spends the core's daily budget: the others keep theirs
  (``test_the_core_budget_is_kept_per_tenant``);
* an operator sets a bound to 0: it is off, for every bound — 0 never means "refuse
  everything" (``test_every_bound_at_0_is_off``; the budget still counts,
  ``test_a_budget_of_0_still_counts_the_runs``).
"""

from __future__ import annotations

import datetime
import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.utils import timezone

from accounts.services import api_token_create
from config.checks import BOUNDS
from pipeline.exceptions import TooManyInquiries
from pipeline.models import Anfrage
from runs import processing
from runs.credits import credit_grant
from runs.exceptions import QueueFull
from runs.models import AnalysisJob, CoreDailyUsage
from tests.conftest import ROOT, run_concurrently
from tests.factories import TenantFactory, UserFactory
from tests.pipeline.conftest import ITEMS_TXT, submit
from tests.runs.factories import DOC_HTML, SOURCES
from tests.security.test_limits import CountingInput

pytestmark = pytest.mark.django_db

JOB = {"title": "T", "doc_html": DOC_HTML, "sources": SOURCES}


def admit(token: str):
    return Client().post(
        "/api/analysis-jobs",
        json.dumps(JOB),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def funded(username: str, tenant) -> tuple:
    user = UserFactory(username=username, tenant=tenant)
    credit_grant(user_id=user.pk, amount=50)
    return user, api_token_create(user=user)


def test_a_users_open_analyses_are_bounded(settings, tenant, footprint):
    settings.MAX_QUEUED_ANALYSES_PER_USER = 3
    _, alices = funded("ann", tenant)
    _, bobs = funded("ben", tenant)

    admitted = [admit(alices) for _ in range(3)]
    before = footprint()
    refused = admit(alices)

    assert [r.status_code for r in admitted] == [201, 201, 201]
    assert refused.status_code == 429
    assert refused.json()["error"] == "queue_full"
    assert "3 of your analyses" in refused.json()["detail"]
    assert footprint() == before
    assert admit(bobs).status_code == 201
    # One finishes: room for one more.
    processing.analysis_job_process(job_id=admitted[0].json()["id"])
    assert admit(alices).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_the_bound_holds_when_admits_race(settings, clean_queue):
    from runs.admission import analysis_job_admit

    settings.MAX_QUEUED_ANALYSES_PER_USER = 3
    user = UserFactory(username="racer", tenant=TenantFactory(slug="race"))
    credit_grant(user_id=user.pk, amount=10)

    results = run_concurrently(
        lambda i: analysis_job_admit(user=user, title=f"T{i}", doc_html=DOC_HTML, sources=SOURCES),
        8,
    )

    assert sum(isinstance(r, QueueFull) for r in results) == 5
    assert AnalysisJob.objects.filter(user=user).count() == 3


def upload(token: str, **extra):
    body = encode_multipart(
        BOUNDARY, {"files": [SimpleUploadedFile("items.txt", ITEMS_TXT.encode())]}
    )
    stream = extra.pop("stream", None) or CountingInput(body)
    return Client().generic(
        "POST",
        "/api/anfragen",
        b"",
        CONTENT_TYPE=MULTIPART_CONTENT,
        CONTENT_LENGTH=str(len(body)),
        HTTP_AUTHORIZATION=f"Bearer {token}",
        **{"wsgi.input": stream},
    )


def test_a_tenants_inquiries_per_hour_are_bounded(settings, tenant, token, footprint):
    settings.MAX_INQUIRIES_PER_TENANT_PER_HOUR = 2
    _, others = funded("olga", TenantFactory(slug="globex"))

    accepted = [upload(token) for _ in range(2)]
    before = footprint()
    refused = upload(token, stream=CountingInput(b"", explode=True))

    assert [r.status_code for r in accepted] == [201, 201]
    assert refused.status_code == 429
    assert refused.json()["error"] == "too_many_inquiries"
    assert 0 < int(refused["Retry-After"]) <= 3600
    assert footprint() == before
    assert upload(others).status_code == 201
    # An hour later the window has moved on.
    Anfrage.objects.filter(tenant=tenant).update(
        created_at=timezone.now() - datetime.timedelta(hours=1, seconds=1)
    )
    assert upload(token).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_the_hourly_bound_holds_when_submits_race(settings, clean_queue, storage_root):
    settings.MAX_INQUIRIES_PER_TENANT_PER_HOUR = 2
    tenant = TenantFactory(slug="busy")

    results = run_concurrently(lambda i: submit(tenant, {f"i{i}.txt": ITEMS_TXT}), 6)

    assert sum(isinstance(r, TooManyInquiries) for r in results) == 4
    assert Anfrage.objects.filter(tenant=tenant).count() == 2


def test_the_core_budget_is_kept_per_tenant(settings, tenant):
    settings.CORE_DAILY_BUDGET = 2
    _, first = funded("amy", tenant)
    _, second = funded("abe", tenant)
    _, other = funded("oz", TenantFactory(slug="globex"))

    spent = [admit(first), admit(second)]
    refused = admit(first)
    theirs = admit(other)

    assert [r.status_code for r in spent] == [201, 201]
    assert refused.status_code == 429
    assert refused.json()["error"] == "budget_exhausted"
    assert 0 < int(refused["Retry-After"]) <= 86_401
    assert theirs.status_code == 201
    assert sorted(CoreDailyUsage.objects.values_list("tenant__slug", "used")) == [
        ("acme", 2),
        ("globex", 1),
    ]


def three_failures_then_the_right_token(tenant) -> list[int]:
    _, token = funded("tess", tenant)
    client = Client(REMOTE_ADDR="203.0.113.9")
    wrong = [client.get("/api/anfragen", HTTP_AUTHORIZATION="Bearer pgs_guess") for _ in range(3)]
    right = client.get("/api/anfragen", HTTP_AUTHORIZATION=f"Bearer {token}")
    return [r.status_code for r in [*wrong, right]]


def three_wrong_passwords_then_the_right_one(tenant) -> list[int]:
    user = UserFactory(username="lena", tenant=tenant)
    user.set_password("right")
    user.save()
    client = Client(REMOTE_ADDR="198.51.100.9")
    login = "/accounts/login/"
    wrong = [client.post(login, {"username": "lena", "password": "no"}) for _ in range(3)]
    right = client.post(login, {"username": "lena", "password": "right"})
    return [r.status_code for r in [*wrong, right]]


def three_admissions(tenant) -> list[int]:
    _, token = funded("adam", tenant)
    return [admit(token).status_code for _ in range(3)]


def three_inquiries(tenant) -> list[int]:
    _, token = funded("ida", tenant)
    return [upload(token).status_code for _ in range(3)]


#: Every bound of docs/security.md, set to 0, and three calls that a bound of 1 would
#: refuse from the second on (as the tests above show with their bounds): 0 turns each
#: one off.
ZERO_IS_OFF = [
    ("AUTH_FAILURE_LIMIT", three_failures_then_the_right_token, [401, 401, 401, 200]),
    ("AUTH_FAILURE_WINDOW_SECONDS", three_failures_then_the_right_token, [401, 401, 401, 200]),
    ("AUTH_FAILURE_LIMIT", three_wrong_passwords_then_the_right_one, [200, 200, 200, 302]),
    ("AUTH_FAILURE_WINDOW_SECONDS", three_wrong_passwords_then_the_right_one, [200, 200, 200, 302]),
    ("CORE_DAILY_BUDGET", three_admissions, [201, 201, 201]),
    ("MAX_QUEUED_ANALYSES_PER_USER", three_admissions, [201, 201, 201]),
    ("MAX_INQUIRIES_PER_TENANT_PER_HOUR", three_inquiries, [201, 201, 201]),
]


def test_the_table_holds_every_bound_and_docs_security_names_each():
    documented = (ROOT / "docs" / "security.md").read_text()

    assert {setting for setting, _, _ in ZERO_IS_OFF} == set(BOUNDS)
    assert [bound for bound in BOUNDS if f"`{bound}`" not in documented] == []


@pytest.mark.parametrize(
    ("setting", "calls", "statuses"),
    ZERO_IS_OFF,
    ids=[f"{setting}-{calls.__name__}" for setting, calls, _ in ZERO_IS_OFF],
)
def test_every_bound_at_0_is_off(settings, tenant, setting, calls, statuses):
    # The bound under test is 0; the others are wide enough not to be the one to refuse.
    for bound, _, _ in ZERO_IS_OFF:
        setattr(settings, bound, 1000)
    setattr(settings, setting, 0)

    assert calls(tenant) == statuses


def test_a_budget_of_0_still_counts_the_runs(settings, tenant):
    settings.CORE_DAILY_BUDGET = 0
    _, token = funded("cora", tenant)

    assert [admit(token).status_code for _ in range(2)] == [201, 201]
    assert CoreDailyUsage.objects.get(tenant=tenant).used == 2
