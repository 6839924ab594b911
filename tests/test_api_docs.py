"""The OpenAPI description and its docs page (served with local assets, no CDN)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_openapi_lists_every_endpoint(client):
    spec = client.get("/api/openapi.json").json()
    assert {
        "/api/analysis-jobs",
        "/api/analysis-jobs/{job_id}",
        "/api/analysis-runs",
        "/api/anfragen",
        "/api/anfragen/{anfrage_id}",
    } <= set(spec["paths"])


def test_docs_page_uses_local_assets(client):
    page = client.get("/api/docs")
    assert page.status_code == 200
    html = page.content.decode()
    assert "swagger-ui-bundle.js" in html and "cdn." not in html
