"""The OpenAPI description and its docs page (served with local assets, no CDN)."""

from __future__ import annotations

import re

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
    # Hashed (swagger-ui-bundle.<hash>.js) once collectstatic ran, plain before.
    assert re.search(r"/static/ninja/swagger-ui-bundle(\.[0-9a-f]{12})?\.js", html)
    assert "cdn." not in html


def test_every_operation_documents_the_error_body(client):
    spec = client.get("/api/openapi.json").json()
    error = spec["components"]["schemas"]["Error"]
    assert error["required"] == ["error", "detail"]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            ref = operation["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
            assert ref == "#/components/schemas/Error", (method, path)
    assert "503" in spec["paths"]["/api/analysis-jobs"]["post"]["responses"]


#: Properties whose values are a closed set: each must be an enum in the schema.
ENUM_PROPERTIES = {"status", "verdict", "saved_by", "stage", "format", "unit"}


def resolve(spec: dict, schema: dict) -> dict:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def enum_values(spec: dict, schema: dict) -> list | None:
    schema = resolve(spec, schema)
    if "enum" in schema:
        return schema["enum"]
    for option in schema.get("anyOf", []):
        values = enum_values(spec, option)
        if values is not None:
            return values
    return None


def test_every_operation_has_a_summary(client):
    spec = client.get("/api/openapi.json").json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            assert operation.get("summary", "").strip(), (method, path)


def test_every_status_like_value_is_an_enum(client):
    spec = client.get("/api/openapi.json").json()
    found = {}
    for name, schema in spec["components"]["schemas"].items():
        for prop, definition in schema.get("properties", {}).items():
            if prop in ENUM_PROPERTIES:
                found[f"{name}.{prop}"] = enum_values(spec, definition)
    assert found, "no status-like property found"
    assert {key: values for key, values in found.items() if not values} == {}
    assert found["AnalysisJobOut.status"] == [
        "queued",
        "pending",
        "running",
        "complete",
        "failed",
        "cancelled",
    ]
    assert found["AdmissionOut.status"] == ["pending", "queued"]
    assert found["StageOut.status"] == ["pending", "running", "success", "failed"]


def test_json_bodies_and_answers_have_examples(client):
    spec = client.get("/api/openapi.json").json()
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                assert resolve(spec, body["schema"]).get("examples"), (method, path, "body")
            for status, answer in operation["responses"].items():
                if not status.startswith("2"):
                    continue
                schema = answer["content"]["application/json"]["schema"]
                schema = resolve(spec, schema.get("items", schema))
                assert schema.get("examples"), (method, path, status)
