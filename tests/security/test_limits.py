"""Resource limits of a single request: the body limit agrees with the schema, and an
upload is refused before it is read and streamed, not held, while it is read.

Fault model:

* a client sends the largest payload the schema allows: it fits the body limit, as UTF-8
  and with ``\\u`` escapes (``test_the_largest_valid_payload_fits_the_body_limit``) and is
  admitted end to end (``test_the_largest_valid_document_is_admitted``);
* a client announces a body larger than any inquiry: refused from ``Content-Length``
  without reading a byte (``test_an_oversized_upload_is_refused_before_it_is_read``);
* a client sends more files than allowed, or one file far too large: reading stops at the
  part or chunk that breaks the limit (``test_reading_stops_where_the_upload_breaks_a_limit``);
* a client sends large files: the request holds one chunk, not the files
  (``test_an_upload_streams_instead_of_being_held_in_memory``).
"""

from __future__ import annotations

import io
import json
import tracemalloc

import pytest
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart

from pipeline.limits import MAX_FILE_BYTES, MAX_FILES, MAX_REQUEST_BYTES
from pipeline.models import Anfrage
from runs import api as runs_api

pytestmark = pytest.mark.django_db


def largest_payload(char: str) -> dict:
    """Every field of the analysis payload at its maximum length, in ``char``."""
    key = "k" * runs_api.MAX_SOURCE_KEY_CHARS
    return {
        "title": char * runs_api.MAX_TITLE_CHARS,
        "doc_html": char * runs_api.MAX_DOC_CHARS,
        "sources": [
            {
                "key": key[:-3] + f"{i:03d}",
                "title": char * runs_api.MAX_SOURCE_TITLE_CHARS,
                "doi": char * runs_api.MAX_DOI_CHARS,
                "text": char * runs_api.MAX_SOURCE_TEXT_CHARS,
            }
            for i in range(runs_api.MAX_SOURCES)
        ],
        "delta_of_job_id": runs_api.MAX_ID,
    }


@pytest.mark.parametrize(
    ("char", "ensure_ascii"),
    [("x", True), ("€", False), ("😀", False), ("€", True)],
    ids=["ascii", "utf8-3-bytes", "utf8-4-bytes", "escaped-bmp"],
)
def test_the_largest_valid_payload_fits_the_body_limit(char, ensure_ascii):
    body = json.dumps(largest_payload(char), ensure_ascii=ensure_ascii).encode()
    assert len(body) <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def test_the_largest_valid_document_is_admitted(token):
    doc = "<p>Water boils [thermo].</p>"
    doc += "x" * (runs_api.MAX_DOC_CHARS - len(doc))
    payload = {
        "title": "t" * runs_api.MAX_TITLE_CHARS,
        "doc_html": doc,
        "sources": [
            {"key": f"s{i}", "text": "Water boils. " * (runs_api.MAX_SOURCE_TEXT_CHARS // 13)}
            for i in range(runs_api.MAX_SOURCES - 1)
        ]
        + [{"key": "thermo", "text": "Water boils."}],
    }

    response = Client().post(
        "/api/analysis-jobs",
        json.dumps(payload),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )

    assert response.status_code == 201, response.content[:300]


class CountingInput(io.BytesIO):
    """A request body that records how much of it the server read."""

    def __init__(self, data: bytes, *, explode: bool = False):
        super().__init__(data)
        self.explode = explode
        self.consumed = 0

    def read(self, size: int = -1) -> bytes:
        if self.explode:
            raise AssertionError("the body was read")
        chunk = super().read(size)
        self.consumed += len(chunk)
        return chunk

    def readline(self, size: int = -1) -> bytes:
        chunk = super().readline(size)
        self.consumed += len(chunk)
        return chunk


def upload(token: str, body: bytes, **extra):
    stream = extra.pop("stream", None) or CountingInput(body)
    response = Client().generic(
        "POST",
        "/api/anfragen",
        b"",
        content_type=MULTIPART_CONTENT,
        HTTP_AUTHORIZATION=f"Bearer {token}",
        CONTENT_TYPE=MULTIPART_CONTENT,
        CONTENT_LENGTH=str(extra.pop("length", len(body))),
        **{"wsgi.input": stream},
    )
    return response, stream


def test_an_oversized_upload_is_refused_before_it_is_read(token, storage_root):
    stream = CountingInput(b"", explode=True)

    response, _ = upload(token, b"", stream=stream, length=MAX_REQUEST_BYTES + 1)

    assert response.status_code == 413
    assert response.json()["error"] == "payload_too_large"
    assert not Anfrage.objects.exists()


#: What the parser may read past the point of refusal (its chunk and look-ahead).
READ_AHEAD = 1024 * 1024


@pytest.mark.parametrize(
    ("parts", "code", "needed"),
    [
        (
            [(f"f{i}.txt", b"1 pcs beam\n") for i in range(MAX_FILES)]
            + [("late.txt", b"1 pcs beam\n" * 400_000)],
            "too_many_files",
            0,
        ),
        (
            [("huge.txt", b"1 pcs beam\n" * (3 * MAX_FILE_BYTES // 11))],
            "file_too_large",
            MAX_FILE_BYTES,
        ),
    ],
    ids=["file-past-the-count", "file-past-the-size"],
)
def test_reading_stops_where_the_upload_breaks_a_limit(token, storage_root, parts, code, needed):
    files = [SimpleUploadedFile(name, data) for name, data in parts]
    body = encode_multipart(BOUNDARY, {"files": files})

    response, stream = upload(token, body)

    assert response.json()["error"] == code
    # Of the refused part, only what shows the problem was read.
    unread_part = len(parts[-1][1])
    assert stream.consumed <= len(body) - unread_part + needed + READ_AHEAD
    assert [p for p in storage_root.rglob("*") if p.is_file()] == []


def test_an_upload_streams_instead_of_being_held_in_memory(token, storage_root):
    line = b"12 pcs steel beam HEA 200, 6 m\n"
    files = [
        SimpleUploadedFile(f"items{i}.txt", b"%d " % i + line * (MAX_FILE_BYTES // len(line) - 1))
        for i in range(3)
    ]
    body = encode_multipart(BOUNDARY, {"files": files})
    stream = CountingInput(body)

    tracemalloc.start()
    try:
        response, _ = upload(token, body, stream=stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert response.status_code == 201, response.content
    # 15 MB of files went through holding well under one of them in memory.
    assert peak < MAX_FILE_BYTES // 2
    staged = [p for p in (storage_root / "staging").rglob("*") if p.is_file()]
    assert len(staged) == 3
    assert list((storage_root / "incoming").iterdir()) == []
