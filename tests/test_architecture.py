"""The layers (docs/design.md#layers): queueing knows neither the reference site's apps
nor the site's own libraries (it is the distribution: it must import in a project that
has only its declared dependencies); the domains never import each other; only config
knows them all."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "queueing": {"pipeline", "runs", "accounts", "config", "environ", "ninja", "pgserver"},
    "pipeline": {"runs", "config"},
    "runs": {"pipeline", "config"},
    "accounts": {"pipeline", "runs", "queueing", "config"},
}


def imported_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    violations = []
    for path in sorted((ROOT / package).rglob("*.py")):
        bad = imported_packages(path) & FORBIDDEN[package]
        if bad:
            violations.append(f"{path.relative_to(ROOT)} imports {sorted(bad)}")
    assert violations == []


def test_the_checker_sees_imports(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("import runs.models\nfrom pipeline import tasks\nfrom . import local\n")
    assert imported_packages(sample) == {"runs", "pipeline"}


#: The reference site's vocabulary, which a project that installs the framework does not
#: share: its messages to operators must speak of jobs, tasks and rows.
DEMO_WORDS = re.compile(r"analys[ie]s|refund|anfrage|inquir|credit|quote", re.IGNORECASE)


def messages_in(path: Path) -> list[str]:
    """The string literals of a module that are not docstrings: what it says to people."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_the_frameworks_messages_speak_its_own_words():
    found = [
        f"{path.relative_to(ROOT)}: {text!r}"
        for path in sorted((ROOT / "queueing").rglob("*.py"))
        if "migrations" not in path.parts
        for text in messages_in(path)
        if DEMO_WORDS.search(text)
    ]
    assert found == []


def test_the_message_checker_skips_docstrings(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text('"""An analysis."""\n\ndef f():\n    """Refund."""\n    return "refund it"\n')
    assert messages_in(sample) == ["refund it"]
