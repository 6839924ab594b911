"""Whatever an extractor returns fits the columns it goes into: over-long text is cut and
out-of-range values refuse the position, each with a warning the tenant sees; the stage
succeeds instead of failing for good on the database's error, and no database error text
ever reaches an API body.

Fault model:

* the default extractor meets a label longer than its column (``Pos 1234…: …``): cut,
  with a warning (``test_an_over_long_label_is_cut_with_a_warning``);
* a plugged extractor returns NUL, over-long text, a quantity, unit or length no column
  holds: cut or refused per position (``test_a_careless_extractor_cannot_break_the_stage``);
* a database error still happens in a stage or a request: the tenant reads that it
  happened, not its text (``test_database_errors_stay_in_the_log``).
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest
from django.db import DataError

from pipeline import stages
from pipeline.extract import ParsedPosition
from pipeline.models import Position, Stage, Unit
from tests.factories import auth_header
from tests.pipeline.conftest import run_stages, submit
from tests.pipeline.extractors import WildExtractor

pytestmark = pytest.mark.django_db


def detail(client, user, anfrage_id: int) -> dict:
    response = client.get(f"/api/anfragen/{anfrage_id}", headers=auth_header(user))
    assert response.status_code == 200
    return response.json()


def test_an_over_long_label_is_cut_with_a_warning(client, user):
    label = "9" * 40
    anfrage = submit(user.tenant, {"items.txt": f"Pos {label}: 12 pcs steel beam HEA 200, 6 m\n"})

    run_stages(anfrage.id)

    body = detail(client, user, anfrage.id)
    assert body["complete"] is True
    [position] = body["positions"]
    assert position["label"] == label[:32]
    [warning] = body["warnings"]
    assert warning["message"] == "position 1: label cut to 32 characters"


def parsed(**changes) -> ParsedPosition:
    fields = {
        "file_id": None,
        "line_no": 1,
        "raw": "12 pcs beam",
        "quantity": Decimal(12),
        "unit": Unit.PIECES,
        "item": "beam",
    }
    return ParsedPosition(**{**fields, **changes})


def test_a_careless_extractor_cannot_break_the_stage(client, user, settings):
    settings.PIPELINE_EXTRACTOR = "tests.pipeline.extractors.WildExtractor"
    WildExtractor.returns = (
        parsed(item="beam\x00" + "x" * 400, label="L\ud800" * 40, material="m" * 100),
        parsed(quantity=Decimal("1e15")),
        parsed(quantity=Decimal("NaN")),
        parsed(unit="lbs"),
        parsed(length_mm=10**12),
        parsed(item="   "),
        parsed(raw="r\x00" * 2000, line_no=2),
    )
    anfrage = submit(user.tenant, {"items.txt": "12 pcs beam\n"})

    try:
        run_stages(anfrage.id)
    finally:
        WildExtractor.returns = ()

    body = detail(client, user, anfrage.id)
    assert body["complete"] is True
    first, last = Position.objects.order_by("position_index")
    assert first.item == "beam\ufffd" + "x" * 295 and len(first.label) == 32
    assert first.material == "m" * 64 and "\x00" not in last.raw and len(last.raw) == 1000
    messages = [w["message"] for w in body["warnings"]]
    assert messages == [
        "position 1: item cut to 300 characters; label cut to 32 characters; "
        "material cut to 64 characters",
        "position refused: quantity 1E+15 is out of range",
        "position refused: quantity Decimal('NaN') is not a number",
        "position refused: unknown unit 'lbs'",
        "position refused: length 1000000000000 mm is out of range",
        "position refused: it names no item",
    ]


def test_database_errors_stay_in_the_log(client, user, monkeypatch):
    anfrage = submit(user.tenant)
    run_stages(anfrage.id, stages=(Stage.INTAKE,))

    def broken(anfrage, result):
        raise DataError('value too long for type character varying(32) in "anfrage_positions"')

    work = stages._STAGES[Stage.EXTRACT]
    monkeypatch.setitem(stages._STAGES, Stage.EXTRACT, dataclasses.replace(work, write=broken))
    with pytest.raises(DataError):
        run_stages(anfrage.id, stages=(Stage.EXTRACT,))

    stage = next(s for s in detail(client, user, anfrage.id)["stages"] if s["stage"] == "extract")
    assert stage["status"] == "failed"
    assert "database error" in stage["error"] and "varying" not in stage["error"]

    monkeypatch.setattr(
        "pipeline.api.anfrage_get", lambda **kwargs: (_ for _ in ()).throw(DataError("secret"))
    )
    response = client.get(f"/api/anfragen/{anfrage.id}", headers=auth_header(user))
    assert response.status_code == 422
    assert response.json() == {
        "error": "unstorable_value",
        "detail": "a value does not fit where it is stored; nothing was written",
    }


def test_no_storable_position_or_none_feasible_still_closes_with_a_zero_quote(user, settings):
    # The one-statement writes of feasibility and calculate with empty arrays, and with
    # prices that are all NULL.
    settings.PIPELINE_EXTRACTOR = "tests.pipeline.extractors.WildExtractor"
    WildExtractor.returns = (parsed(unit="lbs"),)
    try:
        empty = submit(user.tenant, {"items.txt": "12 pcs beam\n"})
        assert run_stages(empty.id) == ["completed"] * 4
    finally:
        WildExtractor.returns = ()
    settings.PIPELINE_EXTRACTOR = ""  # the default extractor
    gnomes = submit(user.tenant, {"a.txt": "1 pcs garden gnome\n2 pcs garden gnome\n"})
    assert run_stages(gnomes.id) == ["completed"] * 4
    for anfrage, count in ((empty, 0), (gnomes, 2)):
        anfrage.refresh_from_db()
        positions = list(Position.objects.filter(anfrage=anfrage))
        assert len(positions) == count
        assert all(p.feasible is False and p.total is None for p in positions)
        assert (anfrage.quote_total, anfrage.completed_at is not None) == (Decimal("0.00"), True)
