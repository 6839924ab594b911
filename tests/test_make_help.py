"""``make help`` lists every target of the Makefile, one line each, so a new target
without its one-line note fails here."""

from __future__ import annotations

import re
import subprocess

from tests.conftest import ROOT


def test_make_help_lists_every_target_once():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z0-9-]+):", makefile, re.M))

    result = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True
    )
    listed = [line.split()[0] for line in result.stdout.splitlines() if line.strip()]

    assert result.returncode == 0, result.stderr
    assert sorted(listed) == sorted(targets)
    assert all(len(line.split(None, 1)) == 2 for line in result.stdout.splitlines())
