"""docs/api.md is the public API: each module's import line on the page is exactly the
module's ``__all__`` (a name added to either alone fails), ``queueing.__all__`` is exactly
the modules on the page, every public name exists and is described, and the settings table
names exactly the settings the framework reads."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from tests.conftest import ROOT

PAGE = (ROOT / "docs" / "api.md").read_text()

MODULES = PAGE.split("## Modules", 1)[1].split("\n## ", 1)[0]


def page_imports() -> dict[str, list[str]]:
    """Module → the names its import line on the page imports (the ``python`` blocks of
    the Modules section)."""
    imports: dict[str, list[str]] = {}
    for block in re.findall(r"```python\n(.*?)```", MODULES, re.DOTALL):
        for node in ast.parse(block).body:
            assert isinstance(node, ast.ImportFrom) and node.module, ast.unparse(node)
            assert node.module not in imports, f"{node.module} has two import lines"
            imports[node.module] = [alias.name for alias in node.names]
    return imports


PUBLIC = page_imports()
#: Public modules without names of their own: gunicorn's configuration module.
CONFIGURATION_MODULES = {"queueing.gunicorn"}


def test_the_page_has_an_import_line_for_every_module_it_lists():
    headings = "\n".join(re.findall(r"^### .*", MODULES, re.MULTILINE))
    headed = set(re.findall(r"`(queueing\.[a-z_]+)`", headings))
    assert headed == set(PUBLIC) | CONFIGURATION_MODULES


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_each_modules_all_is_exactly_its_import_line_on_the_page(module):
    loaded = importlib.import_module(module)
    exported = getattr(loaded, "__all__", None)
    assert exported is not None, f"{module} has no __all__"
    assert sorted(exported) == sorted(PUBLIC[module]), (
        f"{module}.__all__ and its import line on docs/api.md differ"
    )
    assert len(set(exported)) == len(exported)
    for name in exported:
        assert hasattr(loaded, name), f"{module}.{name} is public but does not exist"
        assert re.search(rf"`(?:{re.escape(module)}\.)?{name}\b", MODULES), (
            f"{module}.{name} is on its import line but not described"
        )


def test_the_packages_all_is_exactly_the_modules_on_the_page():
    import queueing

    on_page = set(PUBLIC) | CONFIGURATION_MODULES
    assert {f"queueing.{name}" for name in queueing.__all__} == on_page
    assert len(set(queueing.__all__)) == len(queueing.__all__)


def test_the_page_lists_no_other_module():
    listed = set(re.findall(r"`(queueing(?:\.[a-z_]+)+)`", PAGE))
    permissions = {"queueing.run_sweeps", "queueing.view_metrics"}
    assert listed <= set(PUBLIC) | permissions | CONFIGURATION_MODULES | {"queueing.worker.install"}


def test_the_gunicorn_configuration_is_importable_without_django():
    importlib.import_module("queueing.gunicorn")


def settings_read() -> set[str]:
    """``getattr(settings, "NAME", ...)`` calls and ``*_setting="NAME"`` arguments in the
    framework's code (docstrings aside)."""
    names = set()
    for path in (ROOT / "queueing").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "settings"
                and isinstance(node.args[1], ast.Constant)
            ):
                names.add(node.args[1].value)
            for keyword in node.keywords:
                if (keyword.arg or "").endswith("_setting") and isinstance(
                    keyword.value, ast.Constant
                ):
                    names.add(keyword.value.value)
    return names - {"STATIC_ROOT"}


def test_the_settings_table_names_exactly_the_settings_the_framework_reads():
    table = PAGE.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \|", table, re.MULTILINE))
    assert settings_read() == documented


def literal_defaults() -> dict[str, list]:
    """``getattr(settings, "NAME", <literal>)``: each setting's defaults in the code."""
    found: dict[str, list] = {}
    for path in (ROOT / "queueing").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) == 3
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id == "settings"
                and isinstance(node.args[1], ast.Constant)
            ):
                try:
                    value = ast.literal_eval(node.args[2])
                except ValueError:
                    continue  # a named constant: the table's cell is read by people
                if value is not None:  # None: unset, the table says what that means
                    found.setdefault(node.args[1].value, []).append(value)
    return found


def test_the_settings_tables_defaults_are_the_codes():
    table = PAGE.split("## Settings", 1)[1].split("\n## ", 1)[0]
    documented = dict(re.findall(r"^\| `([A-Z][A-Z0-9_]+)` \| `([^`]*)` \|", table, re.M))
    checked = 0
    for name, defaults in literal_defaults().items():
        assert all(d == defaults[0] for d in defaults), f"{name}: defaults {defaults} in the code"
        if name in documented:
            assert ast.literal_eval(documented[name]) == defaults[0], name
            checked += 1
    assert checked >= 10


#: The framework's own pages: what a project that installs it reads.
FRAMEWORK_PAGES = ("getting-started.md", "queueing.md", "api.md", "design.md")


def setting_like_names(text: str) -> set[str]:
    """The UPPER_SNAKE names a page puts in code spans (``X`` or ``X = ...``)."""
    return set(re.findall(r"`([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)\b[^`]*`", text))


@pytest.mark.parametrize("page", FRAMEWORK_PAGES)
def test_the_framework_pages_name_only_settings_a_project_has(page):
    """A project sets what the page names: the framework's settings (the table above),
    Django's, procrastinate's (``PROCRASTINATE_*``), the environment variables of
    ``queueing.gunicorn`` or a public constant — not the reference site's environment
    variables, which a project does not have."""
    from django.conf import global_settings

    table = PAGE.split("## Settings", 1)[1].split("\n## ", 1)[0]
    environment = set(re.findall(r"`([A-Z][A-Z_]+)`", table.split("Environment variables", 1)[1]))
    public = {name for names in PUBLIC.values() for name in names}
    known = (
        settings_read()
        | {name for name in dir(global_settings) if name.isupper()}
        | environment
        | public
    )
    text = (ROOT / "docs" / page).read_text()
    unknown = {
        name for name in setting_like_names(text) - known if not name.startswith("PROCRASTINATE_")
    }
    assert unknown == set(), f"docs/{page} names settings a project does not have"


def test_the_setting_finder_sees_names_in_code_spans():
    assert setting_like_names("`STALLED_WORKER_SECONDS` (30), `X = 1`, `A_B = 2`, FOO_BAR") == {
        "STALLED_WORKER_SECONDS",
        "A_B",
    }
