"""Streaming an inquiry's upload to disk while its request is read, refusing as early as
the request allows.

:class:`StagingUploadHandler` is Django's upload-handler interface, installed on the
upload request only (``pipeline.api``). It refuses

* a body longer than ``MAX_FILES`` full files can need, from ``Content-Length``, before
  reading a byte;
* the file part past ``MAX_FILES``, an unknown extension, from the part's headers before
  reading its bytes;
* a file past ``MAX_FILE_BYTES`` or holding a NUL byte (binary) at the chunk where that
  shows, without reading further — unless its first chunk shows UTF-16
  (``pipeline.extract.utf16_codec``), whose NUL bytes are text; intake decodes it.

Each file streams in 64 KiB chunks to a temporary file in the storage's ``incoming/``
area, hashed as it arrives, so the request holds one chunk in memory whatever the upload's
size; the temporary file is deleted when the request ends (or when a refusal ends the
parse). Decoding and parsing the text is the intake and extract stages' work, off the
request.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path

from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler
from django.http import HttpRequest

from accounts.api import ClientError
from pipeline import storage
from pipeline.exceptions import (
    BinaryFile,
    EmptyFile,
    FileTooLarge,
    PipelineError,
    RequestTooLarge,
    TooManyFiles,
)
from pipeline.extract import format_by_name, utf16_codec
from pipeline.limits import MAX_FILE_BYTES, MAX_FILES, MAX_REQUEST_BYTES
from pipeline.storage import StagedFile


class StreamedUpload(UploadedFile):
    """An uploaded file in the incoming area (deleted when closed), with the SHA-256 of
    its bytes once complete."""

    def __init__(self, name: str, content_type: str | None, charset: str | None):
        directory = storage.incoming_dir()
        directory.mkdir(parents=True, exist_ok=True)
        # Deleted when closed, i.e. when the request ends or a refusal ends the parse.
        handle = tempfile.NamedTemporaryFile(  # noqa: SIM115
            dir=directory, prefix="upload-", suffix=".part"
        )
        super().__init__(handle, name, content_type, 0, charset)
        self.sha256 = ""

    def temporary_file_path(self) -> str:
        return self.file.name

    def close(self) -> None:
        # Gone already when the request's cleanup closes it a second time.
        with contextlib.suppress(FileNotFoundError):
            self.file.close()

    @property
    def staged(self) -> StagedFile:
        return StagedFile(
            filename=self.name or "",
            path=Path(self.temporary_file_path()),
            sha256=self.sha256,
            size=self.size,
        )


def _refusal(exc: PipelineError) -> ClientError:
    return ClientError(exc.detail, code=exc.code, status=exc.status)


class StagingUploadHandler(FileUploadHandler):
    """Streams each file part to the incoming area, refusing as soon as the request shows
    a problem (a :class:`ClientError`, answered in the API's error shape)."""

    def __init__(self, request: HttpRequest | None = None):
        super().__init__(request)
        self.files_seen = 0
        self.upload: StreamedUpload | None = None

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None):
        if content_length > MAX_REQUEST_BYTES:
            raise _refusal(
                RequestTooLarge(
                    f"the request has {content_length:,} bytes; an inquiry is at most "
                    f"{MAX_FILES} files of {MAX_FILE_BYTES:,} bytes"
                )
            )
        return None

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        self.files_seen += 1
        if self.files_seen > MAX_FILES:
            raise _refusal(TooManyFiles(f"more than {MAX_FILES} files; at most {MAX_FILES}"))
        try:
            format_by_name(file_name)
        except PipelineError as exc:
            raise _refusal(exc) from exc
        self.upload = StreamedUpload(file_name, self.content_type, self.charset)
        self._digest = hashlib.sha256()
        self._size = 0
        self._blank = True
        self._utf16 = False

    def receive_data_chunk(self, raw_data: bytes, start: int):
        self._size += len(raw_data)
        if self._size > MAX_FILE_BYTES:
            self._abandon(
                FileTooLarge(
                    f"file {self.file_name!r} has more than {MAX_FILE_BYTES} bytes; "
                    f"at most {MAX_FILE_BYTES}"
                )
            )
        if start == 0:
            self._utf16 = utf16_codec(raw_data) is not None
        if b"\x00" in raw_data and not self._utf16:
            self._abandon(
                BinaryFile(f"file {self.file_name!r} is binary; send plain text, CSV or Markdown")
            )
        if self._blank and raw_data.strip():
            self._blank = False
        self._digest.update(raw_data)
        self.upload.write(raw_data)
        return None

    def file_complete(self, file_size: int):
        if self._blank:
            self._abandon(EmptyFile(f"file {self.file_name!r} is empty"))
        upload, self.upload = self.upload, None
        upload.flush()
        # Synced before its inquiry's row can commit: intake must always find the bytes.
        os.fsync(upload.file.fileno())
        upload.seek(0)
        upload.size = file_size
        upload.sha256 = self._digest.hexdigest()
        return upload

    def upload_interrupted(self) -> None:
        if self.upload is not None:
            self.upload.close()
            self.upload = None

    def _abandon(self, exc: PipelineError) -> None:
        # The parser closes the files it already holds; this one is still ours.
        self.upload_interrupted()
        raise _refusal(exc)
