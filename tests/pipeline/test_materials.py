"""One truth for a position's material: the dashboard, ``pipeline_status``, the API, the
admin and the API's OpenAPI example show the same value, the catalog's material the
position is priced in, and an assumed one is marked as assumed."""

from __future__ import annotations

import re
from io import StringIO

from django.core.management import call_command
from django.urls import reverse

from pipeline.api import EXAMPLE_POSITION
from pipeline.catalog import default_catalog
from pipeline.models import Position
from tests.factories import auth_header
from tests.pipeline.conftest import run_stages, submit

ITEMS = (
    "12 pcs beam HEA 200, 6 m\n"  # no material: S235 assumed
    "4 pcs steel beam HEB 300, 6 m\n"  # "steel": the catalog's S235
    "2 pcs Träger IPE 240 S355J2, 8 m\n"  # a grade: S355
    "5 garden gnomes\n"  # no catalog item: nothing to assume
)
SHOWN = ["S235 (assumed)", "S235 (steel)", "S355 (S355J2)", ""]


def test_every_view_shows_the_same_material_and_marks_the_assumed_one(client, user):
    anfrage = submit(user.tenant, {"items.txt": ITEMS})
    run_stages(anfrage.id)
    positions = list(Position.objects.filter(anfrage=anfrage).order_by("position_index"))
    assert [p.material_shown for p in positions] == SHOWN
    assert [p.material_assumed for p in positions] == [True, False, False, False]

    body = client.get(f"/api/anfragen/{anfrage.id}", headers=auth_header(user)).json()
    assert [p["material_shown"] for p in body["positions"]] == SHOWN
    assert [p["material_assumed"] for p in body["positions"]] == [True, False, False, False]

    out = StringIO()
    call_command("pipeline_status", "--anfrage", str(anfrage.id), stdout=out)
    lines = out.getvalue().splitlines()
    for index, shown in enumerate(SHOWN, start=1):
        [row] = [line for line in lines if re.match(rf"{index}\s", line)]
        assert shown in row if shown else "S235" not in row, row

    client.force_login(user)
    page = client.get(reverse("inquiry-detail", args=[anfrage.id])).content.decode()
    cells = re.findall(r'<tr id="position-\d+".*?</tr>', page, re.S)
    # Plain cells: the label, the item, the material.
    materials = [re.findall(r"<td>(.*?)</td>", cell, re.S)[2] for cell in cells]
    assert materials == [shown or "—" for shown in SHOWN]


def test_the_openapi_example_shows_a_material_the_code_writes():
    catalog = default_catalog()
    example = Position(
        material=EXAMPLE_POSITION["material"],
        catalog_material=EXAMPLE_POSITION["catalog_material"],
    )
    assert EXAMPLE_POSITION["catalog_material"] in catalog.materials
    assert catalog.resolve_material(EXAMPLE_POSITION["material"]) == example.catalog_material
    assert EXAMPLE_POSITION["material_shown"] == example.material_shown
    assert EXAMPLE_POSITION["material_assumed"] is example.material_assumed
