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


def test_every_operation_documents_the_error_body(client):
    spec = client.get("/api/openapi.json").json()
    error = spec["components"]["schemas"]["Error"]
    assert error["required"] == ["error", "detail"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            ref = operation["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/Error", (method, path)
    assert "503" in spec["paths"]["/api/analysis-jobs"]["post"]["responses"]
