"""Exceptions of the pipeline; ``PipelineError`` is the root.

Each carries the HTTP ``status`` and the machine-readable ``code`` the API answers with
(``pipeline.api`` translates them in one place); commands turn them into ``CommandError``.
"""

from __future__ import annotations

from typing import Any


class PipelineError(Exception):
    """The pipeline refused an operation."""

    status: int = 400
    code: str = "pipeline_error"
    #: False when running the stage again cannot help (the job fails at once).
    retryable: bool = True

    def __init__(self, detail: Any = None):
        self.detail = detail if detail is not None else self.__doc__
        super().__init__(str(self.detail))


class InvalidUpload(PipelineError):
    """An uploaded file cannot be turned into an inquiry."""

    code = "invalid_upload"
    #: The same bytes are refused again: a stage that meets one fails at once.
    retryable = False


class NoFiles(InvalidUpload):
    """An inquiry needs at least one file (multipart field 'files')."""

    code = "no_files"


class TooManyFiles(InvalidUpload):
    """Too many files in one inquiry."""

    code = "too_many_files"


class EmptyFile(InvalidUpload):
    """A file is empty."""

    code = "empty_file"


class FileTooLarge(InvalidUpload):
    """A file is larger than the limit."""

    status = 413
    code = "file_too_large"


class RequestTooLarge(InvalidUpload):
    """The request is larger than an inquiry's files can be."""

    status = 413
    code = "payload_too_large"


class UnexpectedField(InvalidUpload):
    """The upload holds a field other than 'files' and 'title'."""

    code = "unexpected_field"


class UnsupportedMediaType(InvalidUpload):
    """An inquiry is sent as multipart/form-data."""

    status = 415
    code = "unsupported_media_type"


class TooManyPositions(InvalidUpload):
    """The inquiry's files hold more positions than one inquiry may."""

    status = 422
    code = "too_many_positions"


class BinaryFile(InvalidUpload):
    """A file is binary; send plain text, CSV or Markdown."""

    status = 415
    code = "binary_file"


class UnknownFormat(InvalidUpload):
    """A file has an unknown format; send .txt, .csv or .md."""

    status = 415
    code = "unknown_format"


class UnparseableFile(InvalidUpload):
    """No line of a file could be read as a requested item."""

    status = 422
    code = "unparseable_file"


class InvalidTitle(InvalidUpload):
    """The title is too long or holds a character that cannot be stored."""

    status = 422
    code = "invalid_title"


class TooManyInquiries(PipelineError):
    """The tenant submitted as many inquiries as it may in an hour."""

    status = 429
    code = "too_many_inquiries"

    def __init__(self, detail=None, *, retry_after: int = 1):
        super().__init__(detail)
        self.retry_after = retry_after


class AnfrageNotFound(PipelineError):
    """No such inquiry (or it belongs to another tenant)."""

    status = 404
    code = "not_found"


class UnknownStage(PipelineError):
    """No such stage; the stages are intake, extract, feasibility, calculate."""

    code = "unknown_stage"


class ReplayRefused(PipelineError):
    """The stage cannot be replayed in its current state.

    ``remedy`` names what would make the replay go through, for the caller to word in
    its own terms (a command's flags, the admin's actions): ``force`` (the stage already
    succeeded), ``cascade`` (later stages succeeded on the output the replay rewrites),
    or empty (wait, or replay an earlier stage first: ``detail`` says which)."""

    status = 409
    code = "replay_refused"

    def __init__(self, detail: Any = None, *, remedy: str = ""):
        super().__init__(detail)
        self.remedy = remedy


class StorageCorrupt(PipelineError):
    """A stored file's bytes no longer match its SHA-256."""

    status = 500
    code = "storage_corrupt"
    retryable = False


class InvalidCatalog(PipelineError):
    """A catalog definition is malformed."""

    code = "invalid_catalog"
    retryable = False


class QuoteTooLarge(PipelineError):
    """A position's total or the quote passes what a quote holds."""

    status = 422
    code = "quote_too_large"
    retryable = False


class StageInputChanged(PipelineError):
    """A stage's input no longer matches what the stage before it decided."""

    status = 409
    code = "stage_input_changed"
    retryable = False


class StageInputStale(PipelineError):
    """A stage's input changed while it computed (its previous stage committed new
    output); the stage is retried with the fresh input."""

    status = 409
    code = "stage_input_stale"


class StageSuperseded(PipelineError):
    """The stage before this one was reopened by a replay while this one ran; this result
    is discarded and the stage runs again once the replayed stage succeeds."""

    status = 409
    code = "stage_superseded"
    retryable = False
