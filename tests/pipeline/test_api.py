"""POST /api/anfragen and GET /api/anfragen/{id}: happy path, bad input, tenant isolation."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from pipeline.models import Anfrage, AuditEntry, PipelineRun
from queueing.exceptions import DoNotRetry
from tests.conftest import jobs
from tests.factories import UserFactory, auth_header
from tests.pipeline.conftest import ITEMS_CSV, ITEMS_TXT, run_stages, submit

URL = "/api/anfragen"


def upload(name: str, data: str | bytes) -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data.encode() if isinstance(data, str) else data)


def post(client, user, files=(), **fields):
    return client.post(URL, {"files": list(files), **fields}, headers=auth_header(user))


def test_submit_and_follow_an_inquiry(client, user):
    response = post(
        client,
        user,
        [upload("items.txt", ITEMS_TXT), upload("list.csv", ITEMS_CSV)],
        title="Hall 3",
    )
    assert response.status_code == 201, response.content
    anfrage_id = response.json()["id"]
    assert Anfrage.objects.get(pk=anfrage_id).title == "Hall 3"

    body = client.get(f"{URL}/{anfrage_id}", headers=auth_header(user)).json()
    assert [(s["stage"], s["status"]) for s in body["stages"]] == [
        ("intake", "pending"),
        ("extract", "pending"),
        ("feasibility", "pending"),
        ("calculate", "pending"),
    ]
    assert body["complete"] is False and body["quote_total"] is None

    run_stages(anfrage_id)
    body = client.get(f"{URL}/{anfrage_id}", headers=auth_header(user)).json()
    assert body["complete"] is True
    assert [(s["status"], s["attempts"], s["error"]) for s in body["stages"]] == [
        ("success", 1, "")
    ] * 4
    assert len(body["files"]) == 2
    assert [p["index"] for p in body["positions"]] == [1, 2, 3, 4, 5]
    beam = body["positions"][0]
    assert beam["item"] == "steel beam HEA 200" and beam["feasible"] is True
    assert beam["quantity"] == "12.000" and beam["total"] == "2592.00"
    assert Decimal(body["quote_total"]) == sum(
        Decimal(p["total"]) for p in body["positions"] if p["total"]
    )
    assert body["currency"] == "EUR"


def test_a_failed_stage_shows_its_error(client, user):
    anfrage = submit(user.tenant)
    run_stages(anfrage.id)
    PipelineRun.objects.filter(anfrage=anfrage, stage="calculate").update(
        status="failed", error="RuntimeError: boom", attempts=3
    )
    body = client.get(f"{URL}/{anfrage.id}", headers=auth_header(user)).json()
    assert body["stages"][3] | {"started_at": None, "finished_at": None} == {
        "stage": "calculate",
        "status": "failed",
        "waiting": False,
        "attempts": 3,
        "error": "RuntimeError: boom",
        "started_at": None,
        "finished_at": None,
    }


def test_partly_parsing_files_are_accepted_with_warnings(client, user):
    response = post(client, user, [upload("mixed.txt", "12 pcs steel beam, 6 m\nnonsense\n")])
    assert response.status_code == 201
    anfrage_id = response.json()["id"]
    run_stages(anfrage_id)
    body = client.get(f"{URL}/{anfrage_id}", headers=auth_header(user)).json()
    assert len(body["positions"]) == 1
    assert [(w["line_no"], w["line"]) for w in body["warnings"]] == [(2, "nonsense")]


def stored_files(root) -> list:
    return [path for path in root.rglob("*") if path.is_file()]


@pytest.mark.parametrize(
    ("files", "fields", "status", "code", "detail"),
    [
        ([], {}, 400, "no_files", "at least one file"),
        ([upload("empty.txt", b"")], {}, 400, "empty_file", "'empty.txt' is empty"),
        ([upload("blank.txt", b" \n\t\n")], {}, 400, "empty_file", "'blank.txt' is empty"),
        (
            [upload("photo.txt", b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")],
            {},
            415,
            "binary_file",
            "'photo.txt' is binary",
        ),
        (
            [upload("items.pdf", b"%PDF-1.4 12 pcs beam")],
            {},
            415,
            "unknown_format",
            "unknown format '.pdf'",
        ),
        (
            [upload("big.txt", b"1 pcs beam\n" * 500_000)],
            {},
            413,
            "file_too_large",
            "at most 5242880",
        ),
        (
            [upload("a.txt", "1 pcs beam")],
            {"title": "t" * 300},
            422,
            "invalid_title",
            "at most 200",
        ),
        (
            [upload("a.txt", "1 pcs beam")],
            {"title": "Hall\x003"},
            422,
            "invalid_title",
            "title: contains a NUL character",
        ),
        (
            [upload("ok.txt", "1 pcs beam"), upload("bad.md", b"")],
            {},
            400,
            "empty_file",
            "'bad.md'",
        ),
        (
            [upload("a.txt", "1 pcs beam")],
            {"colour": "red"},
            400,
            "unexpected_field",
            "'colour'",
        ),
    ],
)
def test_bad_input_is_a_4xx_naming_the_problem_and_writes_nothing(
    client, user, storage_root, files, fields, status, code, detail
):
    response = post(client, user, files, **fields)
    assert response.status_code == status, response.content
    body = response.json()
    assert body["error"] == code
    assert detail in body["detail"]
    assert not Anfrage.objects.exists()
    assert not AuditEntry.objects.exists()
    assert jobs() == []
    assert stored_files(storage_root) == []


@pytest.mark.parametrize(
    ("name", "data", "stage", "reason"),
    [
        ("note.txt", "Dear sales team,\nplease quote.\n", "extract", "no line reads as"),
        ("a.csv", "1;12;pcs;beam\n", "extract", "header"),
        ("items", b"\x01\x02\x03\x04 12 pcs \x05\x06\x07\x08", "intake", "is binary"),
    ],
)
def test_files_the_request_cannot_judge_cheaply_fail_their_stage_for_good(
    client, user, name, data, stage, reason
):
    # Parsing is the stages' work, off the request: the upload is accepted, and the
    # stage that reads the file refuses it for good with the reason.
    response = post(client, user, [upload(name, data)])
    assert response.status_code == 201, response.content
    anfrage_id = response.json()["id"]
    with pytest.raises(DoNotRetry):
        run_stages(anfrage_id)
    body = client.get(f"{URL}/{anfrage_id}", headers=auth_header(user)).json()
    failed = next(s for s in body["stages"] if s["status"] == "failed")
    assert failed["stage"] == stage
    assert reason in failed["error"]


def test_a_json_body_instead_of_multipart_is_a_415(client, user):
    response = client.post(
        URL, {"title": "x"}, content_type="application/json", headers=auth_header(user)
    )
    assert response.status_code == 415
    assert response.json()["error"] == "unsupported_media_type"
    assert not Anfrage.objects.exists()


def test_unauthenticated_calls_are_refused(client, user):
    anfrage = submit(user.tenant)
    assert client.post(URL, {"files": [upload("a.txt", "1 pcs beam")]}).status_code == 401
    assert client.get(f"{URL}/{anfrage.id}").status_code == 401
    assert Anfrage.objects.count() == 1


def test_another_tenants_inquiry_is_not_found(client, user, other_tenant):
    theirs = submit(other_tenant)
    response = client.get(f"{URL}/{theirs.id}", headers=auth_header(user))
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"
    assert client.get(f"{URL}/999999", headers=auth_header(user)).status_code == 404
    # A user of the other tenant sees it.
    owner = UserFactory(username="bob", tenant=other_tenant)
    assert client.get(f"{URL}/{theirs.id}", headers=auth_header(owner)).status_code == 200


def test_a_non_numeric_id_is_a_4xx(client, user):
    response = client.get(f"{URL}/abc", headers=auth_header(user))
    assert 400 <= response.status_code < 500


def test_the_list_shows_only_the_tenants_inquiries_newest_first(client, user, other_tenant):
    first = submit(user.tenant)
    run_stages(first.id)
    second = submit(user.tenant, {"list.csv": ITEMS_CSV})
    submit(other_tenant)
    response = client.get("/api/anfragen", headers=auth_header(user))
    assert response.status_code == 200
    body = response.json()
    assert [row["id"] for row in body] == [second.id, first.id]
    assert body[1]["complete"] is True and body[1]["quote_total"] is not None
    assert body[0]["complete"] is False
    assert [s["stage"] for s in body[0]["stages"]] == [
        "intake",
        "extract",
        "feasibility",
        "calculate",
    ]
    assert client.get("/api/anfragen?limit=0", headers=auth_header(user)).status_code == 422


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le"])
def test_a_utf16_upload_is_accepted_and_read(client, user, encoding):
    text = "4 Stück Träger HEA 200, 6 m\n2 m Rohr für Geländer\n"
    response = post(client, user, [upload("liste.txt", text.encode(encoding))])
    assert response.status_code == 201, response.content
    anfrage_id = response.json()["id"]
    run_stages(anfrage_id)
    body = client.get(f"{URL}/{anfrage_id}", headers=auth_header(user)).json()
    assert [p["item"] for p in body["positions"]] == ["Träger HEA 200", "Rohr für Geländer"]
    assert body["warnings"] == []
