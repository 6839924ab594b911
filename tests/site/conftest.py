"""Fixtures of the dashboard and metrics tests: two tenants, funded users, inquiries with
stage ledger rows, and analyses admitted and processed in-process through the services."""

from __future__ import annotations

import datetime
import uuid
from decimal import Decimal

import pytest
from django.utils import timezone

from pipeline.models import Anfrage, PipelineRun
from runs.admission import analysis_job_admit
from runs.credits import credit_grant
from runs.models import AnalysisJob, AnalysisRun, SavedBy
from runs.processing import analysis_job_process
from tests.factories import TenantFactory, UserFactory

DOC_HTML = "<p>Water boils at one hundred degrees at sea level [thermo].</p>"
SOURCE = {
    "key": "thermo",
    "title": "Thermodynamics",
    "doi": "10.1000/thermo.1",
    "text": "At sea level water boils at one hundred degrees.",
}


@pytest.fixture
def tenant(db):
    return TenantFactory(slug="acme", name="Acme")


@pytest.fixture
def other_tenant(db):
    return TenantFactory(slug="globex", name="Globex")


def funded_user(tenant, username: str, credits: int = 5):
    user = UserFactory(username=username, tenant=tenant)
    user.set_password("pw")
    user.save()
    if credits:
        credit_grant(user_id=user.pk, amount=credits, note="test")
    return user


@pytest.fixture
def alice(tenant):
    return funded_user(tenant, "alice")


@pytest.fixture
def mallory(other_tenant):
    return funded_user(other_tenant, "mallory")


def admit(user, title: str) -> AnalysisJob:
    admission = analysis_job_admit(user=user, title=title, doc_html=DOC_HTML, sources=[SOURCE])
    return AnalysisJob.objects.get(pk=admission.id)


def process(job: AnalysisJob) -> AnalysisJob:
    """Run the job to completion in-process (what the worker's process_job does)."""
    analysis_job_process(job_id=job.pk)
    job.refresh_from_db()
    return job


def stage_run(
    anfrage: Anfrage,
    stage: str,
    status: str,
    *,
    seconds: float | None = None,
    attempts: int = 1,
    error: str = "",
) -> PipelineRun:
    started = timezone.now() - datetime.timedelta(minutes=5)
    finished = started + datetime.timedelta(seconds=seconds) if seconds is not None else None
    return PipelineRun.objects.create(
        tenant_id=anfrage.tenant_id,
        anfrage=anfrage,
        stage=stage,
        status=status,
        attempts=attempts,
        started_at=started,
        finished_at=finished,
        error=error,
    )


def inquiry(tenant, title: str, quote: str | None = None) -> Anfrage:
    return Anfrage.objects.create(
        tenant=tenant,
        title=title,
        quote_total=Decimal(quote) if quote else None,
        currency="EUR" if quote else "",
    )


def run_row(user, *, title: str, saved_by: SavedBy | None) -> AnalysisRun:
    return AnalysisRun.objects.create(
        id=uuid.uuid4(), tenant_id=user.tenant_id, user=user, title=title, saved_by=saved_by
    )
