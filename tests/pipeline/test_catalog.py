"""Feasibility and pricing against the default catalog and a tenant's own catalog."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline import stages
from pipeline.catalog import catalog_from_dict, check_position, default_catalog, price_position
from pipeline.exceptions import InvalidCatalog
from pipeline.models import Anfrage, Catalog, CatalogItem, Stage, Unit
from pipeline.replay import pipeline_stage_replay
from pipeline.selectors import catalog_for
from tests.pipeline.conftest import run_stages, submit


def check(item, quantity, unit=Unit.PIECES, material="", length_mm=None):
    return check_position(
        default_catalog(),
        item=item,
        quantity=Decimal(quantity),
        unit=unit,
        material=material,
        length_mm=length_mm,
    )


@pytest.mark.parametrize(
    ("args", "feasible", "reason"),
    [
        (("steel beam HEA 200", 12, Unit.PIECES, "steel", 6000), True, "ok"),
        (("Stahlträger HEB 300", 2, Unit.PIECES, "", 6000), True, "assumed S235"),
        (("steel beam HEA 200", 2, Unit.PIECES, "", 14000), False, "exceeds the maximum"),
        (("steel beam HEA 200", 2, Unit.PIECES, "", None), False, "give the piece length"),
        (("steel beam HEA 200", 2, Unit.PIECES, "aluminium", 6000), False, "not made in AlMg3"),
        (("steel beam HEA 200", 2, Unit.PIECES, "unobtainium", 6000), False, "not in the catalog"),
        (("Schrauben M12", 10), False, "below the minimum of 50"),
        (("Schrauben M12", 200, Unit.METRES), False, "sold by pcs, not by m"),
        (("garden gnome", 1), False, "no catalog item matches"),
        # "ipe" is a beam profile, not the end of "pipe"
        (("steel pipe 60x4", 3, Unit.PIECES, "", 3000), True, "ok"),
    ],
)
def test_feasibility(args, feasible, reason):
    verdict = check(*args)
    assert verdict.feasible is feasible
    assert reason in verdict.reason


def test_pipe_is_a_tube_not_a_beam():
    assert check("steel pipe 60x4", 3, Unit.PIECES, "", 3000).catalog_item == "tube"


def test_prices_with_quantity_breaks_and_piece_lengths():
    beam = default_catalog().entry("beam")
    # 1 piece of 6 m at 42.00/m; 12 pieces of 6 m are 72 m: the 50 m break at 36.00/m.
    assert price_position(beam, quantity=Decimal(1), unit=Unit.PIECES, length_mm=6000).total == (
        Decimal("252.00")
    )
    twelve = price_position(beam, quantity=Decimal(12), unit=Unit.PIECES, length_mm=6000)
    assert (twelve.unit_price, twelve.total) == (Decimal("216.00"), Decimal("2592.00"))
    running = price_position(beam, quantity=Decimal("7.5"), unit=Unit.METRES, length_mm=None)
    assert (running.unit_price, running.total) == (Decimal("42.00"), Decimal("315.00"))


def test_a_tenants_own_catalog_replaces_the_default(tenant):
    catalog = Catalog.objects.create(
        tenant=tenant, name="Acme", currency="CHF", materials={"S235": ["steel"]}
    )
    CatalogItem.objects.create(
        catalog=catalog,
        code="beam",
        name="Beam",
        keywords=["beam"],
        materials=["S235"],
        unit=Unit.PIECES,
        min_quantity=1,
        price_breaks=[["1", "100.00"]],
    )
    spec = catalog_for(tenant_id=tenant.id)
    assert spec.currency == "CHF"
    assert [e.code for e in spec.items] == ["beam"]
    assert catalog_for(tenant_id=tenant.id + 1000) is default_catalog()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"materials": {}, "items": []}, "needs materials"),
        ({"materials": {"S235": []}, "items": []}, "at least one item"),
        ({"materials": {"S235": []}, "items": [{"code": "x", "unit": "lbs"}]}, "unit"),
        (
            {
                "materials": {"S235": []},
                "items": [{"code": "x", "unit": "pcs", "keywords": ["x"], "materials": ["S999"]}],
            },
            "unknown",
        ),
        (
            {
                "materials": {"S235": []},
                "items": [
                    {
                        "code": "x",
                        "unit": "pcs",
                        "keywords": ["x"],
                        "materials": ["S235"],
                        "price_breaks": [["1", "cheap"]],
                    }
                ],
            },
            "not a number",
        ),
    ],
)
def test_invalid_catalogs_are_refused(data, message):
    with pytest.raises(InvalidCatalog, match=message):
        catalog_from_dict(data)


def _own_catalog(tenant) -> Catalog:
    catalog = Catalog.objects.create(
        tenant=tenant,
        name="Acme",
        currency="CHF",
        materials={"S235": ["steel", "Baustahl"], "1.4301": ["V2A", "stainless"]},
    )
    # Created out of order: items are matched in sort order, ids only break ties.
    for code, order, keywords in (("bolt", 2, ["Schrauben"]), ("beam", 1, ["beam", "HEA"])):
        CatalogItem.objects.create(
            catalog=catalog,
            code=code,
            name=code.title(),
            keywords=keywords,
            materials=["S235", "1.4301"],
            unit=Unit.PIECES,
            max_length_mm=12000 if code == "beam" else None,
            min_quantity=Decimal("2.5") if code == "beam" else 1,
            price_breaks=[["1", "100.00"], [10, 90.5]],
            sort_order=order,
        )
    return catalog


def test_a_stage_reads_the_same_catalog_as_catalog_for(tenant):
    """A stage reads its tenant's catalog after its claim, as one JSON document: item for
    item, in order, and with exact decimals, it is ``catalog_for``'s."""
    _own_catalog(tenant)
    anfrage = submit(tenant)
    run_stages(anfrage.id, (Stage.INTAKE, Stage.EXTRACT))
    for stage in (Stage.FEASIBILITY, Stage.CALCULATE):
        read = stages._CatalogRead(stages._read_input(anfrage.id, stage, stages._STAGES[stage]))
        read.send()
        inquiry = read.read()
        assert stages._stage_catalog(inquiry) == catalog_for(tenant_id=tenant.id)
    assert [e.code for e in catalog_for(tenant_id=tenant.id).items] == ["beam", "bolt"]


def test_a_changed_catalog_prices_the_next_run(tenant):
    """Parsed catalogs are kept per process by their content: a changed price is another
    document, never a stale hit."""
    _own_catalog(tenant)
    anfrage = submit(tenant, {"a.txt": "12 pcs beam HEA 200\n"})
    run_stages(anfrage.id)
    assert Anfrage.objects.get(pk=anfrage.id).quote_total == Decimal("90.50") * 12
    CatalogItem.objects.filter(code="beam").update(price_breaks=[["1", "80.00"]])
    pipeline_stage_replay(
        tenant_id=tenant.id, anfrage_id=anfrage.id, stage=Stage.CALCULATE, force=True, actor="t"
    )
    run_stages(anfrage.id, (Stage.CALCULATE,))
    assert Anfrage.objects.get(pk=anfrage.id).quote_total == Decimal("80.00") * 12


def test_a_material_resolves_to_the_first_code_that_names_it():
    spec = catalog_from_dict(
        {
            "materials": {"S235": ["steel", "Baustahl"], "S355": ["steel", "S355J2"]},
            "items": [
                {
                    "code": "beam",
                    "unit": "pcs",
                    "keywords": ["beam"],
                    "materials": ["S235"],
                    "price_breaks": [["1", "1"]],
                }
            ],
        }
    )
    assert spec.resolve_material(" Steel ") == "S235"
    assert spec.resolve_material("s 355 j2") == "S355"
    assert spec.resolve_material("s355") == "S355"
    assert spec.resolve_material("unobtainium") is None
