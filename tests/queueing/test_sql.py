"""Named SQL helpers (``queueing/sql.py``): an array sent as a literal reads back as the
list it was, whatever its elements hold."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from hypothesis import given, settings
from hypothesis import strategies as st
from procrastinate.contrib.django.utils import connector_params

from queueing.sql import array_literal

pytestmark = pytest.mark.django_db

# PostgreSQL text holds any character but NUL.
TEXT = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)))


@settings(max_examples=200, deadline=None)
@given(values=st.lists(TEXT, max_size=8))
def test_a_text_array_literal_reads_back_as_its_values(values):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::varchar[]", [array_literal(tuple(values))])
        assert cursor.fetchone()[0] == values


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=8))
def test_a_float_array_literal_reads_back_as_its_values(values):
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::float8[]", [array_literal(tuple(values))])
        assert cursor.fetchone()[0] == values


def test_the_edge_cases_a_task_name_or_queue_could_hold_bound_on_the_server():
    """As the worker sends them: bound on the server, prepared (an unknown-typed text the
    cast parses)."""
    odd = ["", "NULL", "a,b", "{x}", 'quo"te', "back\\slash", " spaced ", "ünï"]
    params = {**connector_params(), "prepare_threshold": 0}
    with psycopg.connect(**params, autocommit=True) as raw:
        for _ in range(2):  # prepared on the first run, executed by name on the second
            row = raw.execute(
                "SELECT %(names)s::varchar[], %(seconds)s::float8[]",
                {"names": array_literal(tuple(odd)), "seconds": array_literal((0.5, 1800.0))},
            ).fetchone()
            assert row == (odd, [0.5, 1800.0])
