"""Feasibility and pricing against the default catalog and a tenant's own catalog."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.catalog import catalog_from_dict, check_position, default_catalog, price_position
from pipeline.exceptions import InvalidCatalog
from pipeline.models import Catalog, CatalogItem, Unit
from pipeline.selectors import catalog_for


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
