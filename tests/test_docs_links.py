"""Every relative link and #anchor in README.md and docs/*.md resolves, and no page cites
a document that is not in the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCED = re.compile(r"^```.*?^```$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
EXPLICIT_ID = re.compile(r"""<a\s+(?:id|name)=["']([^"']+)["']""")


def prose(text: str) -> str:
    """The page without its code blocks and code spans (links there are examples)."""
    return CODE_SPAN.sub("", FENCED.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = "".join(c for c in text.lower() if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCED.sub("", path.read_text())
    found: set[str] = set(EXPLICIT_ID.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(text):
        base = slug(heading)
        count = seen.get(base, 0)
        found.add(base if count == 0 else f"{base}-{count}")
        seen[base] = count + 1
    return found


def links(path: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(prose(path.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, mailto: …
    ]


def broken(path: Path) -> list[str]:
    problems = []
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            problems.append(f"{target}: no such file")
            continue
        if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            problems.append(f"{target}: no anchor #{anchor} in {resolved.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_and_anchor_resolves(page):
    assert broken(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_page_cites_a_document_outside_the_repository(page):
    text = page.read_text()
    assert "DESIGN §" not in text and "DESIGN.md" not in text
    assert not re.search(r"seeds/\S+\.txt", text)


def test_the_checker_finds_broken_links_and_anchors(tmp_path):
    (tmp_path / "other.md").write_text("# A title: with `code`\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#a-title-with-code) [ok](other.md#twice-1) [own](#here)\n"
        "[gone](missing.md) [no anchor](other.md#nope) [web](https://example.com/x)\n"
        "```\n[in code](nowhere.md)\n```\n# Here\n"
    )
    assert broken(page) == [
        "missing.md: no such file",
        "other.md#nope: no anchor #nope in other.md",
    ]
