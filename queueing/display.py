"""Plain-text tables and progress for management commands (no extra dependency)."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO, TypeVar

from django.core.management.base import OutputWrapper

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


def progress(
    items: Sequence[T], *, label: str, stream: TextIO | OutputWrapper | None = None
) -> Iterator[T]:
    """Yield ``items`` while drawing ``label [#####     ] 3/10`` on ``stream`` (stderr, or
    a command's ``self.stderr``).

    Only a terminal gets the redrawn bar; a file or pipe (a log) gets plain lines, one
    per tenth of the way, so it holds no carriage returns.
    """
    out = stream or sys.stderr

    def write(text: str) -> None:
        # A command's output would end each redraw with a newline of its own.
        if isinstance(out, OutputWrapper):
            out.write(text, ending="")
        else:
            out.write(text)

    total = len(items)
    width = 30
    terminal = out.isatty() if hasattr(out, "isatty") else False
    step = max(total // 10, 1)
    for index, item in enumerate(items, start=1):
        yield item
        if terminal:
            filled = int(width * index / total) if total else width
            write(f"\r{label} [{'#' * filled}{' ' * (width - filled)}] {index}/{total}")
            out.flush()
        elif index % step == 0 or index == total:
            write(f"{label}: {index}/{total}\n")
    if total and terminal:
        write("\n")
