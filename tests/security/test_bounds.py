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
  (``test_the_core_budget_is_kept_per_tenant``).
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
from pipeline.exceptions import TooManyInquiries
from pipeline.models import Anfrage
from runs import processing
from runs.credits import credit_grant
from runs.exceptions import QueueFull
from runs.models import AnalysisJob, CoreDailyUsage
from tests.conftest import run_concurrently
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
