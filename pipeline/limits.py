"""The pipeline's bounds on one inquiry, declared once (docs/security.md lists them)."""

from __future__ import annotations

import re
from decimal import Decimal

MAX_FILES = 20
MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_TITLE = 200
#: The largest upload request: every file at its limit plus room for the parts' headers
#: and the title. A longer ``Content-Length`` is refused before the body is read.
MAX_REQUEST_BYTES = MAX_FILES * MAX_FILE_BYTES + 256 * 1024
#: Positions one inquiry may hold; extract refuses an inquiry with more.
MAX_POSITIONS = 10_000
#: The largest amount a position's total or a quote holds (``numeric(14, 2)``); calculate
#: refuses an inquiry whose quote passes it.
MAX_AMOUNT = Decimal("999999999999.99")
#: Unreadable lines kept as warnings per inquiry; the rest are counted in one more.
MAX_WARNINGS = 1_000
#: What PostgreSQL text cannot hold (NUL, lone surrogates): replaced in names and in an
#: extractor's output, which must fit its columns whatever a plugged extractor returns.
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
