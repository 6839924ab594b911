"""Plain-text tables and progress for management commands (no extra dependency)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

T = TypeVar("T")


def format_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Align columns; numbers right-aligned, text left-aligned."""
    rows = [["" if c is None else c for c in row] for row in rows]
    cells = [[str(c) for c in header], *[[str(c) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(values: Sequence[str], raw: Sequence[Any] | None = None) -> str:
        out = []
        for i, v in enumerate(values):
            numeric = raw is not None and isinstance(raw[i], int | float)
            out.append(v.rjust(widths[i]) if numeric else v.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [line(cells[0]), "  ".join("-" * w for w in widths)]
    lines += [line(c, r) for c, r in zip(cells[1:], rows, strict=True)]
    if not rows:
        lines.append("(no rows)")
    return "\n".join(lines)


def progress(items: Sequence[T], *, label: str, stream: TextIO | None = None) -> Iterator[T]:
    """Yield ``items`` while drawing ``label [#####     ] 3/10`` on ``stream`` (stderr).

    Only a terminal gets the redrawn bar; a file or pipe (a log) gets plain lines, one
    per tenth of the way, so it holds no carriage returns.
    """
    stream = stream or sys.stderr
    total = len(items)
    width = 30
    terminal = stream.isatty() if hasattr(stream, "isatty") else False
    step = max(total // 10, 1)
    for index, item in enumerate(items, start=1):
        yield item
        if terminal:
            filled = int(width * index / total) if total else width
            stream.write(f"\r{label} [{'#' * filled}{' ' * (width - filled)}] {index}/{total}")
            stream.flush()
        elif index % step == 0 or index == total:
            stream.write(f"{label}: {index}/{total}\n")
    if total and terminal:
        stream.write("\n")
