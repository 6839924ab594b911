"""Command output helpers: tables, and progress that animates only on a terminal."""

from __future__ import annotations

import io

from django.core.management.base import OutputWrapper

from queueing.display import format_table, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_redraws_a_bar_on_a_terminal():
    stream = Terminal()
    assert list(progress(range(3), label="replay", stream=stream)) == [0, 1, 2]
    assert stream.getvalue().count("\r") == 3
    assert stream.getvalue().endswith("] 3/3\n")


def test_progress_redraws_in_place_through_a_commands_output():
    # A command's self.stderr ends every write with a newline unless told otherwise.
    terminal = Terminal()
    list(progress(range(3), label="replay", stream=OutputWrapper(terminal)))
    assert terminal.getvalue().count("\n") == 1
    assert terminal.getvalue().endswith("] 3/3\n")


def test_progress_writes_plain_lines_to_a_file():
    stream = io.StringIO()
    assert len(list(progress(range(25), label="replay", stream=stream))) == 25
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines[0] == "replay: 2/25" and lines[-1] == "replay: 25/25"
    assert len(lines) <= 13


def test_progress_of_nothing_writes_nothing():
    for stream in (Terminal(), io.StringIO()):
        assert list(progress([], label="x", stream=stream)) == []
        assert stream.getvalue() == ""


def test_table_shows_zero_as_zero():
    assert format_table(["n"], [[0]]).splitlines()[-1].strip() == "0"
