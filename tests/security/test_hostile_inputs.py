"""Hostile and careless input, table-driven, over every API endpoint and every command:
each case is a request (or a command line), the status (or ``CommandError``) it must get,
and "no row and no file written", checked by counting every table a request can write
and every file under the storage root before and after.

Fault model (what an attacker or a careless client sends, where it is stopped, and the
cases that show it):

* no, wrong, revoked or non-bearer credentials: authentication, 401 with
  ``WWW-Authenticate`` on every method (``auth-*``, the revoked-token test);
* a body that is not JSON, or not ``application/json``: the API's parser, 400 / 415
  (``json-*``);
* NUL or a lone surrogate in any text field: the schema or the service, 422 naming the
  field (``nul-*``, the field-naming test);
* values past a field's limit or the body limit: the schema (422), the body limit (413)
  (``limit-*``);
* foreign, out-of-range or malformed ids and cursors: 404 / 422 / 400 (``id-*``);
* unknown paths and wrong methods: 404 / 405 in the same error shape (``route-*``);
* bad multipart, too many, too large, binary or empty files: the upload handler while the
  body streams (``upload-*``);
* over-long, NUL, undecodable or control-character arguments and out-of-range numbers:
  argparse types and services, a ``CommandError`` (``COMMAND_CASES``, and the subprocess
  test for bytes no terminal can decode).
"""

from __future__ import annotations

import base64
import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

from accounts.models import ApiToken
from accounts.services import api_token_create, api_token_revoke
from pipeline.limits import MAX_FILE_BYTES, MAX_FILES, MAX_REQUEST_BYTES
from pipeline.models import Anfrage
from runs.admission import analysis_job_admit
from runs.api import MAX_DOC_CHARS, MAX_SOURCES
from runs.credits import credit_grant
from runs.judge import MAX_CITATIONS
from tests.conftest import ROOT, database_url
from tests.factories import TenantFactory, UserFactory
from tests.pipeline.conftest import ITEMS_TXT, submit
from tests.runs.factories import DOC_HTML, SOURCES

pytestmark = pytest.mark.django_db

JSON = "application/json"
OK_SOURCE = {"key": "thermo", "title": "T", "doi": "10.1000/x.1", "text": "Water boils."}
OK_JOB = {"title": "T", "doc_html": "<p>Water boils [thermo].</p>", "sources": [OK_SOURCE]}


def job(**changes: Any) -> dict[str, Any]:
    return {**OK_JOB, **changes}


def source(**changes: Any) -> dict[str, Any]:
    return job(sources=[{**OK_SOURCE, **changes}])


def files(*parts: tuple[str, bytes], **fields: str) -> bytes:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return encode_multipart(
        BOUNDARY,
        {"files": [SimpleUploadedFile(name, data) for name, data in parts], **fields},
    )


def cursor_of(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@dataclass(frozen=True)
class Case:
    id: str
    method: str
    path: str
    status: int
    code: str
    body: bytes | str | dict | list | None = None
    content_type: str = JSON
    auth: str = "token"  # token | none | wrong | basic | empty-bearer
    extra: dict[str, str] = field(default_factory=dict)


ANALYSES = "/api/analysis-jobs"
RUNS = "/api/analysis-runs"
ANFRAGEN = "/api/anfragen"
UPLOAD = MULTIPART_CONTENT
ITEM = ("items.txt", b"12 pcs steel beam HEA 200, 6 m\n")

CASES = [
    # -- authentication: 401 with a challenge, never a CSRF 403, on every method
    Case("auth-none-get", "GET", ANALYSES, 401, "unauthenticated", auth="none"),
    Case("auth-none-post", "POST", ANALYSES, 401, "unauthenticated", OK_JOB, auth="none"),
    Case(
        "auth-none-upload",
        "POST",
        ANFRAGEN,
        401,
        "unauthenticated",
        files(ITEM),
        UPLOAD,
        auth="none",
    ),
    Case("auth-none-save", "POST", RUNS, 401, "unauthenticated", {"job_id": 1}, auth="none"),
    Case("auth-wrong-get", "GET", ANFRAGEN, 401, "unauthenticated", auth="wrong"),
    Case("auth-wrong-post", "POST", ANALYSES, 401, "unauthenticated", OK_JOB, auth="wrong"),
    Case(
        "auth-wrong-upload",
        "POST",
        ANFRAGEN,
        401,
        "unauthenticated",
        files(ITEM),
        UPLOAD,
        auth="wrong",
    ),
    Case("auth-basic", "GET", RUNS, 401, "unauthenticated", auth="basic"),
    Case(
        "auth-empty-bearer",
        "POST",
        RUNS,
        401,
        "unauthenticated",
        {"job_id": 1},
        auth="empty-bearer",
    ),
    # -- JSON endpoints take application/json only, and JSON only
    Case("json-broken", "POST", ANALYSES, 400, "invalid_json", "{bad"),
    Case("json-nested", "POST", ANALYSES, 400, "invalid_json", "[" * 100_000),
    Case("json-huge-int", "POST", ANALYSES, 400, "invalid_json", '{"title": ' + "9" * 5000 + "}"),
    Case("json-not-utf8", "POST", RUNS, 400, "invalid_json", b'{"job_id": "\xff\xfe"}'),
    Case(
        "json-as-form",
        "POST",
        ANALYSES,
        415,
        "unsupported_media_type",
        "title=T&doc_html=x",
        "application/x-www-form-urlencoded",
    ),
    Case(
        "json-as-text",
        "POST",
        ANALYSES,
        415,
        "unsupported_media_type",
        json.dumps(OK_JOB),
        "text/plain",
    ),
    Case("json-as-multipart", "POST", RUNS, 415, "unsupported_media_type", files(ITEM), UPLOAD),
    Case("json-array", "POST", ANALYSES, 422, "invalid_payload", [OK_JOB]),
    Case("json-extra-field", "POST", ANALYSES, 422, "invalid_payload", job(owner="mallory")),
    Case("json-missing-field", "POST", RUNS, 422, "invalid_payload", {}),
    # -- characters PostgreSQL cannot store: 422 naming the field
    Case("nul-title", "POST", ANALYSES, 422, "invalid_payload", job(title="T\x00")),
    Case(
        "nul-doc", "POST", ANALYSES, 422, "invalid_payload", job(doc_html="<p>a [thermo]\x00</p>")
    ),
    Case("nul-source-title", "POST", ANALYSES, 422, "invalid_payload", source(title="\x00")),
    Case("nul-source-text", "POST", ANALYSES, 422, "invalid_payload", source(text="a\x00b")),
    Case("nul-doi", "POST", ANALYSES, 422, "invalid_payload", source(doi="10.1000/\x00")),
    Case(
        "nul-surrogate-title",
        "POST",
        ANALYSES,
        422,
        "invalid_payload",
        json.dumps(OK_JOB).replace('"title": "T"', '"title": "T\\ud800"'),
    ),
    Case(
        "nul-surrogate-text",
        "POST",
        ANALYSES,
        422,
        "invalid_payload",
        json.dumps(OK_JOB).replace("Water boils.", "\\udfff"),
    ),
    Case("nul-job-id", "POST", RUNS, 422, "invalid_payload", {"job_id": "\x00"}),
    Case(
        "nul-upload-title",
        "POST",
        ANFRAGEN,
        422,
        "invalid_title",
        files(ITEM, title="Hall\x003"),
        UPLOAD,
    ),
    # -- limits of fields and of the body
    Case("limit-title", "POST", ANALYSES, 422, "invalid_payload", job(title="t" * 201)),
    Case(
        "limit-doc",
        "POST",
        ANALYSES,
        422,
        "invalid_payload",
        job(doc_html="[thermo]" + "x" * MAX_DOC_CHARS),
    ),
    Case(
        "limit-sources",
        "POST",
        ANALYSES,
        422,
        "invalid_payload",
        job(sources=[{**OK_SOURCE, "key": f"s{i}"} for i in range(MAX_SOURCES + 1)]),
    ),
    Case("limit-source-key", "POST", ANALYSES, 422, "invalid_payload", source(key="k" * 65)),
    Case(
        "limit-duplicate-keys",
        "POST",
        ANALYSES,
        422,
        "invalid_payload",
        job(sources=[OK_SOURCE, OK_SOURCE]),
    ),
    Case(
        "limit-body",
        "POST",
        ANALYSES,
        413,
        "payload_too_large",
        json.dumps(job(doc_html="x" * (17 * 1024 * 1024))),
    ),
    Case("limit-no-citations", "POST", ANALYSES, 422, "no_citations", job(doc_html="<p>x</p>")),
    Case(
        "limit-citations",
        "POST",
        ANALYSES,
        422,
        "too_many_citations",
        job(doc_html="<p>" + "Claim [thermo]. " * (MAX_CITATIONS + 1) + "</p>"),
    ),
    Case("limit-bad-doi", "POST", ANALYSES, 422, "invalid_doi", source(doi="not-a-doi")),
    Case("limit-no-sources", "POST", ANALYSES, 422, "no_sources", job(sources=[])),
    Case("limit-delta-id", "POST", ANALYSES, 422, "invalid_payload", job(delta_of_job_id=2**63)),
    Case("limit-list", "GET", f"{ANALYSES}?limit=100000", 422, "invalid_payload"),
    Case("limit-list-zero", "GET", f"{ANFRAGEN}?limit=0", 422, "invalid_payload"),
    # -- ids and cursors: foreign is 404, malformed 422 / 400
    Case("id-foreign-job", "GET", "/api/analysis-jobs/{foreign_job}", 404, "not_found"),
    Case(
        "id-foreign-verdicts", "GET", "/api/analysis-jobs/{foreign_job}/verdicts", 404, "not_found"
    ),
    Case("id-foreign-save", "POST", RUNS, 404, "not_found", {"job_id": "{foreign_job}"}),
    Case(
        "id-foreign-delta", "POST", ANALYSES, 404, "not_found", job(delta_of_job_id="{foreign_job}")
    ),
    Case("id-foreign-anfrage", "GET", "/api/anfragen/{foreign_anfrage}", 404, "not_found"),
    Case(
        "id-foreign-positions", "GET", "/api/anfragen/{foreign_anfrage}/positions", 404, "not_found"
    ),
    Case(
        "id-foreign-warnings", "GET", "/api/anfragen/{foreign_anfrage}/warnings", 404, "not_found"
    ),
    Case("id-missing-job", "GET", "/api/analysis-jobs/999999999", 404, "not_found"),
    Case("id-text", "GET", "/api/analysis-jobs/abc", 422, "invalid_payload"),
    Case("id-huge", "GET", "/api/anfragen/99999999999999999999", 422, "invalid_payload"),
    Case("id-zero", "GET", "/api/anfragen/0/positions", 422, "invalid_payload"),
    Case("id-cursor-junk", "GET", f"{ANALYSES}?cursor=%%%", 400, "invalid_cursor"),
    Case("id-cursor-nul", "GET", f"{ANFRAGEN}?cursor=%00", 400, "invalid_cursor"),
    Case("id-cursor-shape", "GET", f"{RUNS}?cursor={cursor_of([1, 2, 3])}", 400, "invalid_cursor"),
    Case("id-cursor-type", "GET", f"{ANFRAGEN}?cursor={cursor_of(['x'])}", 400, "invalid_cursor"),
    Case(
        "id-cursor-naive",
        "GET",
        f"{ANALYSES}?cursor={cursor_of(['2020-01-01T00:00', 1])}",
        400,
        "invalid_cursor",
    ),
    Case("id-cursor-huge", "GET", f"{ANFRAGEN}?cursor={cursor_of([2**70])}", 400, "invalid_cursor"),
    Case("id-cursor-long", "GET", f"{ANFRAGEN}?cursor={'a' * 500}", 422, "invalid_payload"),
    # -- routes: the error shape everywhere under /api/
    Case("route-unknown", "GET", "/api/nope", 404, "not_found"),
    Case("route-unknown-post", "POST", "/api/nope/deeper", 404, "not_found", OK_JOB),
    Case("route-trailing-slash", "GET", "/api/analysis-jobs/", 404, "not_found"),
    Case("route-delete", "DELETE", ANALYSES, 405, "method_not_allowed"),
    Case("route-put", "PUT", "/api/anfragen/{own_anfrage}", 405, "method_not_allowed", {}),
    Case("route-patch", "PATCH", RUNS, 405, "method_not_allowed", {}),
    # -- uploads: refused while streaming, nothing kept
    Case(
        "upload-no-boundary",
        "POST",
        ANFRAGEN,
        400,
        "invalid_multipart",
        b"abc",
        "multipart/form-data",
    ),
    Case("upload-no-files", "POST", ANFRAGEN, 400, "no_files", files(title="x"), UPLOAD),
    Case(
        "upload-too-many",
        "POST",
        ANFRAGEN,
        400,
        "too_many_files",
        files(*[(f"f{i}.txt", b"1 pcs beam\n") for i in range(MAX_FILES + 1)]),
        UPLOAD,
    ),
    Case(
        "upload-too-large",
        "POST",
        ANFRAGEN,
        413,
        "file_too_large",
        files(("big.txt", b"1 pcs beam\n" * (MAX_FILE_BYTES // 11 + 1))),
        UPLOAD,
    ),
    Case(
        "upload-content-length",
        "POST",
        ANFRAGEN,
        413,
        "payload_too_large",
        files(ITEM),
        UPLOAD,
        extra={"CONTENT_LENGTH": str(MAX_REQUEST_BYTES + 1)},
    ),
    Case(
        "upload-binary",
        "POST",
        ANFRAGEN,
        415,
        "binary_file",
        files(ITEM, ("x.txt", b"GIF89a\x00\x01")),
        UPLOAD,
    ),
    Case(
        "upload-extension",
        "POST",
        ANFRAGEN,
        415,
        "unknown_format",
        files(("x.exe", b"MZ 12 pcs")),
        UPLOAD,
    ),
    Case("upload-empty", "POST", ANFRAGEN, 400, "empty_file", files(ITEM, ("e.md", b"")), UPLOAD),
    Case(
        "upload-title", "POST", ANFRAGEN, 422, "invalid_title", files(ITEM, title="t" * 201), UPLOAD
    ),
    Case(
        "upload-field",
        "POST",
        ANFRAGEN,
        400,
        "unexpected_field",
        files(ITEM, tenant="globex"),
        UPLOAD,
    ),
    Case("upload-json", "POST", ANFRAGEN, 415, "unsupported_media_type", OK_JOB),
]


@pytest.fixture
def world(user, token):
    """The caller's own inquiry, and another tenant's inquiry and complete job."""
    mallory = UserFactory(username="mallory", tenant=TenantFactory(slug="globex"))
    credit_grant(user_id=mallory.pk, amount=5)
    theirs = analysis_job_admit(user=mallory, title="T", doc_html=DOC_HTML, sources=SOURCES)
    return {
        "own_anfrage": submit(user.tenant, {"items.txt": ITEMS_TXT}).id,
        "foreign_anfrage": submit(mallory.tenant, {"items.txt": ITEMS_TXT}).id,
        "foreign_job": theirs.id,
    }


def _fill(value: Any, ids: dict[str, int]) -> Any:
    if isinstance(value, str):
        for name, pk in ids.items():
            if value == "{" + name + "}":
                return pk
            value = value.replace("{" + name + "}", str(pk))
        return value
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, ids) for v in value]
    return value


def send(case: Case, token: str, ids: dict[str, int]):
    headers = {
        "token": {"HTTP_AUTHORIZATION": f"Bearer {token}"},
        "none": {},
        "wrong": {"HTTP_AUTHORIZATION": "Bearer pgs_not-a-token"},
        "basic": {"HTTP_AUTHORIZATION": "Basic YWxpY2U6cHc="},
        "empty-bearer": {"HTTP_AUTHORIZATION": "Bearer "},
    }[case.auth]
    body = _fill(case.body, ids)
    if isinstance(body, dict | list):
        body = json.dumps(body)
    if body is None:
        body = b""
    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    return client.generic(
        case.method,
        _fill(case.path, ids),
        body,
        content_type=case.content_type,
        **headers,
        **case.extra,
    )


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hostile_request_is_refused_in_the_error_shape_and_writes_nothing(
    case, token, world, footprint
):
    before = footprint()

    response = send(case, token, world)

    assert response.status_code == case.status, response.content[:500]
    assert response["Content-Type"].startswith(JSON)
    body = response.json()
    assert set(body) == {"error", "detail"} and body["error"] == case.code, body
    assert footprint() == before
    if case.status == 401:
        assert response["WWW-Authenticate"].startswith('Bearer realm="pgstage"')
    if case.status == 405:
        assert response["Allow"]


def test_the_table_covers_every_operation_of_the_api():
    from config.api import api

    schema = api.get_openapi_schema()
    operations = {
        (method.upper(), path) for path, methods in schema["paths"].items() for method in methods
    }
    patterns = {
        (method, path): re.compile("^" + re.sub(r"\{[^}]+\}", "[^/]+", path) + "$")
        for method, path in operations
    }
    covered = {
        operation
        for case in CASES
        for operation, pattern in patterns.items()
        if operation[0] == case.method and pattern.match(case.path.split("?")[0])
    }
    assert operations - covered == set()


def test_nul_in_a_field_is_named_in_the_answer(token, footprint):
    before = footprint()
    response = send(
        Case("nul", "POST", ANALYSES, 422, "invalid_payload", source(text="a\x00b")), token, {}
    )
    [error] = response.json()["detail"]
    assert error["loc"][-1] == "text" and "NUL" in error["msg"]
    assert footprint() == before


def test_hostile_file_names_are_stored_as_plain_names(token, storage_root):
    body = files(("../../etc/pass\x00wd.txt", ITEMS_TXT.encode()))
    response = send(Case("upload", "POST", ANFRAGEN, 201, "", body, UPLOAD), token, {})

    assert response.status_code == 201, response.content
    [entry] = Anfrage.objects.get(pk=response.json()["id"]).uploads
    assert entry["filename"] == "passwd.txt"
    staged = [p for p in storage_root.rglob("*") if p.is_file()]
    assert [p.parent.parent.name for p in staged] == ["staging"]


def test_a_revoked_token_is_a_401_on_every_method(user, footprint):
    token = api_token_create(user=user)
    api_token_revoke(token_id=ApiToken.objects.get(user=user, revoked_at__isnull=True).pk)
    before = footprint()
    for case in (
        Case("g", "GET", ANALYSES, 401, "unauthenticated"),
        Case("p", "POST", ANALYSES, 401, "unauthenticated", OK_JOB),
        Case("u", "POST", ANFRAGEN, 401, "unauthenticated", files(ITEM), UPLOAD),
    ):
        response = send(case, token, {})
        assert response.status_code == 401
        assert response["WWW-Authenticate"] == 'Bearer realm="pgstage", error="invalid_token"'
    assert footprint() == before


# -- commands --------------------------------------------------------------------------


@dataclass(frozen=True)
class CommandCase:
    id: str
    args: tuple[str, ...]
    message: str
    files: Callable[[Any], list[str]] | None = None


COMMAND_CASES = [
    CommandCase(
        "grant-over-64-bit",
        ("grant_credits", "--user", "alice", "--amount", str(2**63)),
        "at most 9223372036854775807",
    ),
    CommandCase(
        "grant-zero", ("grant_credits", "--user", "alice", "--amount", "0"), "--amount 1 or more"
    ),
    CommandCase(
        "grant-not-a-number",
        ("grant_credits", "--user", "alice", "--amount", "1e3"),
        "invalid int value",
    ),
    CommandCase(
        "grant-long-user", ("grant_credits", "--user", "u" * 10_000, "--amount", "1"), "at most 150"
    ),
    CommandCase("grant-nul-user", ("grant_credits", "--user", "al\x00ice", "--amount", "1"), "NUL"),
    CommandCase(
        "grant-undecodable-user",
        ("grant_credits", "--user", "al\udcffice", "--amount", "1"),
        "surrogate",
    ),
    CommandCase(
        "grant-nul-note",
        ("grant_credits", "--user", "alice", "--amount", "1", "--note", "\x00"),
        "NUL",
    ),
    CommandCase(
        "token-long-tenant",
        ("create_api_token", "--tenant", "t" * 65, "--user", "bob"),
        "at most 64",
    ),
    CommandCase(
        "token-long-user",
        ("create_api_token", "--tenant", "acme", "--user", "b" * 151),
        "at most 150",
    ),
    CommandCase(
        "token-control-user",
        ("create_api_token", "--tenant", "acme", "--user", "bob\x1b[31m"),
        "letters, digits",
    ),
    CommandCase(
        "token-space-user",
        ("create_api_token", "--tenant", "acme", "--user", "bob smith"),
        "letters, digits",
    ),
    CommandCase(
        "token-nul-user", ("create_api_token", "--tenant", "acme", "--user", "b\x00b"), "NUL"
    ),
    CommandCase(
        "token-long-name",
        ("create_api_token", "--tenant", "acme", "--user", "bob", "--name", "n" * 101),
        "at most 100",
    ),
    CommandCase(
        "token-nul-name",
        ("create_api_token", "--tenant", "acme", "--user", "bob", "--name", "a\x00"),
        "NUL",
    ),
    CommandCase(
        "token-undecodable-tenant",
        ("create_api_token", "--tenant", "\udcff", "--user", "bob"),
        "surrogate",
    ),
    CommandCase("queue-nul-user", ("queue_status", "--user", "\x00"), "NUL"),
    CommandCase("status-huge-id", ("pipeline_status", "--anfrage", "9" * 20), "from 1 to"),
    CommandCase("status-negative-limit", ("pipeline_status", "--limit", "-1"), "from 1 to"),
    CommandCase("status-nul-tenant", ("pipeline_status", "--tenant", "\x00"), "NUL"),
    CommandCase(
        "replay-zero-id",
        ("replay_stage", "--tenant", "acme", "--anfrage", "0", "--stage", "extract"),
        "from 1 to",
    ),
    CommandCase(
        "replay-nul-stage",
        ("replay_stage", "--tenant", "acme", "--anfrage", "1", "--stage", "\x00"),
        "NUL",
    ),
    CommandCase(
        "replay-failed-limit", ("replay_failed", "--stage", "extract", "--limit", "0"), "from 1 to"
    ),
    CommandCase(
        "replay-failed-tenant",
        ("replay_failed", "--stage", "extract", "--tenant", "a\udcff"),
        "surrogate",
    ),
    CommandCase("submit-nul-tenant", ("submit_anfrage", "--tenant", "\x00", "{ok}"), "NUL"),
    CommandCase(
        "submit-nul-title", ("submit_anfrage", "--tenant", "acme", "--title", "\x00", "{ok}"), "NUL"
    ),
    CommandCase(
        "submit-large-file", ("submit_anfrage", "--tenant", "acme", "{big}"), "at most 5242880"
    ),
    CommandCase(
        "submit-too-many",
        ("submit_anfrage", "--tenant", "acme", *["{ok}"] * (MAX_FILES + 1)),
        "at most 20",
    ),
    CommandCase("submit-dev-zero", ("submit_anfrage", "--tenant", "acme", "/dev/zero"), "regular"),
    CommandCase("submit-fifo", ("submit_anfrage", "--tenant", "acme", "{fifo}"), "regular"),
    CommandCase("submit-directory", ("submit_anfrage", "--tenant", "acme", "{dir}"), "directory"),
    CommandCase("submit-missing", ("submit_anfrage", "--tenant", "acme", "{dir}/nope"), "cannot"),
    CommandCase(
        "submit-long-title",
        ("submit_anfrage", "--tenant", "acme", "--title", "t" * 201, "{ok}"),
        "at most 200",
    ),
    CommandCase(
        "replay-analyses-huge-limit",
        ("replay_failed_analyses", "--limit", "99999999999999999999"),
        "from 1 to",
    ),
    CommandCase("replay-analyses-zero-limit", ("replay_failed_analyses", "--limit", "0"), "from 1"),
    CommandCase(
        "replay-analyses-text-limit", ("replay_failed_analyses", "--limit", "ten"), "whole"
    ),
    CommandCase(
        "replay-analyses-far-since", ("replay_failed_analyses", "--since", "999999d"), "year 1"
    ),
    CommandCase(
        "replay-analyses-junk-since", ("replay_failed_analyses", "--since", "\x00"), "give an age"
    ),
    CommandCase(
        "replay-analyses-undecodable-user",
        ("replay_failed_analyses", "--user", "\udcff"),
        "surrogate",
    ),
    CommandCase("replay-analyses-nul-user", ("replay_failed_analyses", "--user", "a\x00"), "NUL"),
    CommandCase("retry-analysis-huge-id", ("retry_analysis", "--job", "9" * 20), "not a job id"),
    CommandCase("retry-analysis-text-id", ("retry_analysis", "--job", "one"), "invalid int"),
    CommandCase(
        "grant-huge-amount", ("grant_credits", "--user", "alice", "--amount", "9" * 30), "1 or more"
    ),
    CommandCase(
        "grant-text-amount", ("grant_credits", "--user", "alice", "--amount", "1e3"), "invalid int"
    ),
    CommandCase("queue-undecodable-user", ("queue_status", "--user", "\udcff"), "surrogate"),
    CommandCase(
        "rebase-marks-argument", ("rebase_credit_marks", "--user", "alice"), "unrecognized"
    ),
    CommandCase("sweep-unknown", ("sweep", "\x00"), "unknown sweep|no sweep"),
    CommandCase("sweep-text-batch", ("sweep", "--all", "--batch-size", "nan"), "invalid int"),
    CommandCase("demo-text-workers", ("demo", "--workers", "inf"), "whole number"),
    CommandCase("auth-reset-nothing", ("reset_auth_failures",), "one of the arguments"),
    CommandCase("auth-reset-nul", ("reset_auth_failures", "--address", "1\x00"), "NUL"),
    CommandCase("auth-reset-long", ("reset_auth_failures", "--address", "1" * 65), "at most 64"),
    CommandCase("auth-reset-blank", ("reset_auth_failures", "--address", " "), "empty"),
    CommandCase(
        "auth-reset-scope", ("reset_auth_failures", "--all", "--scope", "x"), "invalid choice"
    ),
    CommandCase("sweep-batch", ("sweep", "--all", "--batch-size", "0"), "at least 1"),
    CommandCase("sweep-huge-batch", ("sweep", "--all", "--batch-size", "9" * 20), "at most"),
    CommandCase("demo-workers", ("demo", "--workers", "0"), "from 1 to"),
    CommandCase("run-all-concurrency", ("run_all", "--concurrency", "0"), "at least 1"),
    CommandCase("health-nan", ("worker_health", "--max-age", "nan"), "positive number"),
    CommandCase("health-inf", ("worker_health", "--max-age", "inf"), "positive number"),
    CommandCase("health-huge", ("worker_health", "--max-age", "1e308"), "positive number"),
    CommandCase("health-zero", ("worker_health", "--max-age", "-0"), "positive number"),
    CommandCase("health-nul", ("worker_health", "--max-age", "\x00"), "not a number"),
    CommandCase("sweep-long-name", ("sweep", "x" * 10_000), "no sweep|unknown sweep"),
    CommandCase("sweep-name-and-all", ("sweep", "finished_jobs", "--all"), "name one sweep"),
    CommandCase("sweep-negative-batch", ("sweep", "--all", "--batch-size", "-1"), "at least 1"),
    CommandCase(
        "replay-unknown-stage",
        ("replay_failed", "--stage", "nope"),
        "unknown stage",
    ),
    CommandCase(
        "replay-unknown-tenant",
        ("replay_stage", "--tenant", "nope", "--anfrage", "1", "--stage", "extract"),
        "no tenant",
    ),
    CommandCase(
        "replay-huge-id",
        ("replay_stage", "--tenant", "acme", "--anfrage", str(2**63), "--stage", "extract"),
        "from 1 to",
    ),
    CommandCase("replay-analyses-negative-since", ("replay_failed_analyses", "--since=-1d"), "age"),
    CommandCase(
        "auth-reset-undecodable", ("reset_auth_failures", "--address", "\udcff"), "surrogate"
    ),
    CommandCase(
        "auth-reset-two-targets",
        ("reset_auth_failures", "--address", "::1", "--all"),
        "not allowed",
    ),
    CommandCase("run-all-huge-concurrency", ("run_all", "--concurrency", "9" * 30), "at most 100"),
    CommandCase("run-all-text-concurrency", ("run_all", "--concurrency", "two"), "whole number"),
    CommandCase("run-all-port-zero", ("run_all", "--port", "0"), "1-65535"),
    CommandCase("run-all-huge-port", ("run_all", "--port", "9" * 30), "1-65535"),
    CommandCase("run-all-text-port", ("run_all", "--port", "http"), "1-65535"),
    CommandCase("run-all-nul-host", ("run_all", "--host", "a\x00"), "NUL"),
    CommandCase("run-all-blank-host", ("run_all", "--host", " "), "name an address"),
    CommandCase("run-all-long-host", ("run_all", "--host", "h" * 300), "at most 253"),
]


@pytest.fixture
def command_files(tmp_path):
    ok = tmp_path / "items.txt"
    ok.write_text(ITEMS_TXT)
    big = tmp_path / "big.txt"
    with open(big, "wb") as handle:
        handle.truncate(MAX_FILE_BYTES + 1)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"ok": str(ok), "big": str(big), "fifo": str(fifo), "dir": str(tmp_path)}


@pytest.mark.parametrize("case", COMMAND_CASES, ids=lambda c: c.id)
def test_hostile_command_line_is_a_command_error_and_writes_nothing(
    case, user, command_files, footprint
):
    args = [_fill(a, command_files) for a in case.args]
    before = footprint()

    with pytest.raises(CommandError, match=case.message):
        call_command(*args, stdout=io.StringIO(), stderr=io.StringIO())

    assert footprint() == before


@pytest.mark.parametrize("port", ["abc", "80.5", "-1", "99999"])
def test_run_all_with_a_bad_port_in_the_environment_is_a_command_error(
    port, monkeypatch, footprint
):
    """``PORT`` is the default of ``--port`` (``make run PORT=…``): checked like the flag."""
    monkeypatch.setenv("PORT", port)
    before = footprint()

    with pytest.raises(CommandError, match="1-65535"):
        call_command("run_all", stdout=io.StringIO(), stderr=io.StringIO())

    assert footprint() == before


def test_the_table_has_cases_for_every_command_of_the_project():
    from django.core.management import get_commands

    ours = {
        name
        for name, app in get_commands().items()
        if app in {"accounts", "config", "pipeline", "queueing", "runs"}
    }
    covered = {case.args[0] for case in COMMAND_CASES}

    assert ours - covered == set()


def test_a_64_bit_grant_is_accepted_and_shown(user):
    out = io.StringIO()
    call_command("grant_credits", "--user", "alice", "--amount", str(2**31), stdout=out)
    assert str(2**31 + 100) in out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_undecodable_bytes_on_the_real_command_line_print_no_traceback(user):
    result = subprocess.run(
        [sys.executable, "manage.py", "grant_credits", "--user", b"al\xffice", "--amount", "1"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert b"Traceback" not in result.stderr
    assert b"surrogate" in result.stderr


# -- the admin's list pages ------------------------------------------------------------

JOBS_ADMIN = "/admin/procrastinate/procrastinatejob/"
#: A query string of an admin list, and the status a superuser and view-only staff get.
#: A value the database refuses (a NUL in a text lookup, a label outside procrastinate's
#: status enum) is the client's error: 400, never a 500.
ADMIN_CASES = [
    ("admin-nul-choice-filter", "/admin/accounts/authfailure/?scope=%00", 400),
    ("admin-nul-stage-filter", "/admin/pipeline/pipelinerun/?status=a%00b", 400),
    ("admin-nul-key-prefix", f"{JOBS_ADMIN}?key=%00", 400),
    ("admin-nul-task-filter", f"{JOBS_ADMIN}?task_name=%00", 400),
    ("admin-nul-lock-link", f"{JOBS_ADMIN}?queueing_lock=exclusive/%00", 400),
    ("admin-nul-lookup", "/admin/pipeline/anfrage/?title__startswith=%00", 400),
    ("admin-enum-status", f"{JOBS_ADMIN}?status=%C3%A9", 400),
    ("admin-enum-status-in", f"{JOBS_ADMIN}?status__in=todo,nope", 400),
    ("admin-enum-status-long", f"{JOBS_ADMIN}?status__exact={'x' * 3000}", 400),
    ("admin-nul-search", f"{JOBS_ADMIN}?q=%00", 200),
    ("admin-kind-junk", f"{JOBS_ADMIN}?kind=%00", 200),
    ("admin-key-like", f"{JOBS_ADMIN}?key=%25_", 200),
    ("admin-huge-id-search", "/admin/runs/analysisjob/?q=" + "9" * 30, 200),
    ("admin-huge-id-filter", "/admin/runs/analysisjob/?id__exact=" + "9" * 30, 200),
    ("admin-text-id-filter", "/admin/runs/analysisjob/?id=abc", 302),  # Django: ?e=1
    ("admin-sweeps-page", f"{JOBS_ADMIN}sweeps/?x=%00", 200),
]


@pytest.mark.django_db(transaction=True)  # a refused query aborts its transaction
@pytest.mark.parametrize(
    ("path", "status"), [c[1:] for c in ADMIN_CASES], ids=[c[0] for c in ADMIN_CASES]
)
def test_hostile_admin_query_is_refused_and_writes_nothing(path, status, world, footprint):
    """Every list filter is shown (each has rows to offer: the world's jobs carry keys)."""
    from django.contrib.auth.models import Permission

    viewer = UserFactory(username="viewer", is_staff=True)
    viewer.user_permissions.add(*Permission.objects.filter(codename__startswith="view_"))
    superuser = UserFactory(username="root", is_staff=True, is_superuser=True)
    for staff in (viewer, superuser):
        client = Client(raise_request_exception=False)
        client.force_login(staff)
        before = footprint()

        response = client.get(path)

        assert response.status_code == status, (staff.username, response.content[:300])
        if status == 400:
            assert response.json()["error"] == "invalid_query"
        assert footprint() == before


# -- the dashboard's pages -------------------------------------------------------------

#: (id, who, method, path, status): forged, huge, foreign and non-ASCII ids answer 404,
#: never another tenant's row; anonymous callers go to the login page.
DASHBOARD_CASES = [
    ("dash-huge-analysis", "user", "GET", "/dashboard/analyses/" + "9" * 20, 404),
    ("dash-zero-analysis", "user", "GET", "/dashboard/analyses/0", 404),
    ("dash-negative-analysis", "user", "GET", "/dashboard/analyses/-1", 404),
    ("dash-foreign-analysis", "user", "GET", "/dashboard/analyses/{foreign_job}", 404),
    ("dash-foreign-inquiry", "user", "GET", "/dashboard/inquiries/{foreign_anfrage}", 404),
    (
        "dash-foreign-file",
        "user",
        "GET",
        "/dashboard/inquiries/{foreign_anfrage}/files/{foreign_file}",
        404,
    ),
    (
        "dash-foreign-file-own-inquiry",
        "user",
        "GET",
        "/dashboard/inquiries/{own_anfrage}/files/{foreign_file}",
        404,
    ),
    ("dash-huge-file", "user", "GET", "/dashboard/inquiries/{own_anfrage}/files/" + "9" * 30, 404),
    ("dash-non-ascii-id", "user", "GET", "/dashboard/inquiries/%C3%A9", 404),
    ("dash-nul-id", "user", "GET", "/dashboard/inquiries/1%00", 404),
    ("dash-workers-query", "user", "GET", "/dashboard/workers?x=%00", 200),
    ("dash-workers-head", "user", "HEAD", "/dashboard/workers", 200),
    ("dash-page-head", "user", "HEAD", "/dashboard/", 200),
    ("dash-analysis-head", "user", "HEAD", "/dashboard/analyses/{foreign_job}", 404),
    ("dash-workers-post", "user", "POST", "/dashboard/workers", 405),
    ("dash-anonymous-workers", "none", "GET", "/dashboard/workers", 302),
    ("dash-anonymous-file", "none", "GET", "/dashboard/inquiries/{own_anfrage}/files/1", 302),
]


@pytest.mark.parametrize(
    ("who", "method", "path", "status"),
    [c[1:] for c in DASHBOARD_CASES],
    ids=[c[0] for c in DASHBOARD_CASES],
)
def test_hostile_dashboard_request_is_refused_and_writes_nothing(
    who, method, path, status, user, world, footprint
):
    from pipeline.models import AnfrageFile
    from tests.pipeline.conftest import run_stages

    run_stages(world["foreign_anfrage"], stages=["intake"])
    ids = {**world, "foreign_file": AnfrageFile.objects.get(anfrage=world["foreign_anfrage"]).pk}
    client = Client(raise_request_exception=False)
    if who == "user":
        client.force_login(user)
    before = footprint()

    response = client.generic(method, _fill(path, ids))

    assert response.status_code == status, response.content[:300]
    assert footprint() == before


#: (id, changelist, action, selected id, status): a selected id that is not one of the
#: table's ids is a 400 before the action runs; an id of no row selects nothing.
ADMIN_ACTION_CASES = [
    ("action-text-id", "/admin/runs/analysisjob/", "retry_failed", "abc", 400),
    ("action-nul-id", "/admin/accounts/apitoken/", "revoke", "\x00", 400),
    ("action-non-ascii-id", JOBS_ADMIN, "retry", "é", 400),
    ("action-uuid-for-int", "/admin/pipeline/pipelinerun/", "replay_stage", str(uuid4()), 400),
    ("action-text-id-delete", "/admin/accounts/tenant/", "delete_selected", "abc", 400),
    ("action-text-id-group", "/admin/auth/group/", "delete_selected", "abc", 400),
    ("action-text-id-reset", "/admin/accounts/authfailure/", "reset", "x", 400),
    ("action-huge-id", "/admin/runs/analysisjob/", "refund", "9" * 30, 302),
    ("action-negative-id", JOBS_ADMIN, "cancel", "-1", 302),
]


@pytest.mark.parametrize(
    ("path", "action", "selected", "status"),
    [c[1:] for c in ADMIN_ACTION_CASES],
    ids=[c[0] for c in ADMIN_ACTION_CASES],
)
def test_an_admin_action_on_a_forged_id_is_refused_and_writes_nothing(
    path, action, selected, status, world, footprint
):
    client = Client(raise_request_exception=False)
    client.force_login(UserFactory(username="root", is_staff=True, is_superuser=True))
    before = footprint()

    response = client.post(path, {"action": action, "_selected_action": [selected]})

    assert response.status_code == status, response.content[:300]
    assert footprint() == before
