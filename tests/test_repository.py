"""The repository's own files are whole: no file holds a merge's conflict markers (a
Markdown page renders them as text, and a Python module with them does not import, so its
tests are never collected)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

SKIPPED = {".git", ".venv", ".data", "node_modules", "__pycache__", "dist", "build"}
SUFFIXES = {".py", ".md", ".toml", ".sql", ".html", ".css", ".js", ".yaml", ".yml", ".txt"}
#: A conflict's opening or closing line (spelled so that this module holds none).
MARKER = re.compile("^(" + "<" * 7 + "|" + ">" * 7 + ") ", re.MULTILINE)


def text_files(root: Path) -> list[Path]:
    found = []
    for path in root.iterdir():
        if path.name in SKIPPED:
            continue
        if path.is_dir():
            found.extend(text_files(path))
        elif path.suffix in SUFFIXES or path.name in {"Makefile", "Dockerfile"}:
            found.append(path)
    return found


def conflicted(root: Path) -> list[str]:
    return sorted(
        str(path.relative_to(root))
        for path in text_files(root)
        if MARKER.search(path.read_text(errors="replace"))
    )


def test_no_file_holds_a_merge_conflict():
    assert conflicted(ROOT) == []


def test_the_checker_finds_a_conflict(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text(
        "intro\n" + "<" * 7 + " HEAD\nours\n" + "=" * 7 + "\ntheirs\n" + ">" * 7 + " b\n"
    )
    (tmp_path / "clean.py").write_text("x = '<<< not a marker'\n")

    assert conflicted(tmp_path) == ["docs/page.md"]
