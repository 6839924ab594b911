"""What a tenant can make and what it costs: pure functions over a frozen catalog.

A catalog comes from the tenant's ``Catalog`` rows or, for a tenant without one, from the
default shipped as data (``pipeline/data/default_catalog.json``); ``selectors.catalog_for``
picks (a stage reads the rows as one JSON document with its input:
:func:`catalog_from_document`). :func:`check_position` decides feasibility (item, unit,
material, maximum length, minimum quantity) and :func:`price_position` prices a feasible
position with quantity breaks. Nothing here touches the database.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import cache, cached_property, lru_cache
from importlib import resources
from typing import Any

from pipeline.exceptions import InvalidCatalog
from pipeline.models import Unit

CENT = Decimal("0.01")
_LETTER = r"[^\W\d_]"


@dataclass(frozen=True, kw_only=True)
class PriceBreak:
    min_quantity: Decimal
    unit_price: Decimal


@dataclass(frozen=True, kw_only=True)
class CatalogEntry:
    code: str
    name: str
    keywords: tuple[str, ...]
    materials: tuple[str, ...]
    unit: Unit
    max_length_mm: int | None
    min_quantity: Decimal
    price_breaks: tuple[PriceBreak, ...]

    def matches(self, item: str) -> bool:
        return any(_keyword_pattern(k).search(item) for k in self.keywords)

    def price_for(self, quantity: Decimal) -> Decimal:
        """The unit price of the largest break whose minimum ``quantity`` reaches."""
        price = self.price_breaks[0].unit_price
        for brk in self.price_breaks:
            if quantity >= brk.min_quantity:
                price = brk.unit_price
        return price


@dataclass(frozen=True, kw_only=True)
class CatalogSpec:
    name: str
    currency: str
    materials: Mapping[str, tuple[str, ...]]
    items: tuple[CatalogEntry, ...]
    version: str

    def match(self, item: str) -> CatalogEntry | None:
        """The first entry (in catalog order) whose keywords occur in ``item``."""
        return next((entry for entry in self.items if entry.matches(item)), None)

    def entry(self, code: str) -> CatalogEntry | None:
        return next((entry for entry in self.items if entry.code == code), None)

    def resolve_material(self, text: str) -> str | None:
        """The material code ``text`` names (a code or an alias, case-insensitive; the
        first such code in catalog order)."""
        return self._material_codes.get(_normalise(text))

    @cached_property
    def _material_codes(self) -> dict[str, str]:
        # Every spelling, normalised, to the first code that it names: built once per
        # catalog instead of once per position.
        codes: dict[str, str] = {}
        for code, aliases in self.materials.items():
            for spelling in (code, *aliases):
                codes.setdefault(_normalise(spelling), code)
        return codes


@dataclass(frozen=True, kw_only=True)
class Verdict:
    feasible: bool
    reason: str
    catalog_item: str = ""
    catalog_material: str = ""


@dataclass(frozen=True, kw_only=True)
class Price:
    unit_price: Decimal
    total: Decimal


def _normalise(text: str) -> str:
    return re.sub(r"\s+", "", text).lower()


@cache
def _keyword_pattern(keyword: str) -> re.Pattern[str]:
    # Short codes (HEA, IPE, RHS) must stand alone ("ipe" is no pipe); longer words may
    # begin or end a compound, as German heads do ("Stahlträger", "Edelstahlrohr").
    word = re.escape(keyword.lower())
    if len(keyword) <= 3:
        return re.compile(rf"(?<!{_LETTER}){word}(?!{_LETTER})", re.IGNORECASE)
    return re.compile(rf"(?<!{_LETTER}){word}|{word}(?!{_LETTER})", re.IGNORECASE)


def _decimal(value: Any, what: str) -> Decimal:
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        raise InvalidCatalog(f"{what}: {value!r} is not a number") from None
    if not number.is_finite() or number < 0:
        raise InvalidCatalog(f"{what}: {value!r} must be a number >= 0")
    return number


def entry_from_dict(data: Mapping[str, Any], materials: Mapping[str, Any]) -> CatalogEntry:
    """Validate one item definition (as in the data file or a ``CatalogItem`` row)."""
    code = str(data.get("code") or "")
    where = f"catalog item {code or '?'!r}"
    if not code:
        raise InvalidCatalog("a catalog item needs a code")
    try:
        unit = Unit(data.get("unit"))
    except ValueError:
        raise InvalidCatalog(f"{where}: unit must be one of {Unit.values}") from None
    keywords = tuple(str(k) for k in data.get("keywords") or () if str(k).strip())
    if not keywords:
        raise InvalidCatalog(f"{where}: needs at least one keyword")
    item_materials = tuple(str(m) for m in data.get("materials") or ())
    unknown = [m for m in item_materials if m not in materials]
    if not item_materials or unknown:
        raise InvalidCatalog(
            f"{where}: materials must be non-empty codes of the catalog (unknown: {unknown})"
        )
    breaks = []
    for pair in data.get("price_breaks") or ():
        if not isinstance(pair, Sequence) or len(pair) != 2:
            raise InvalidCatalog(f"{where}: a price break is [min_quantity, unit_price]")
        breaks.append(
            PriceBreak(min_quantity=_decimal(pair[0], where), unit_price=_decimal(pair[1], where))
        )
    if not breaks:
        raise InvalidCatalog(f"{where}: needs at least one price break")
    max_length = data.get("max_length_mm")
    return CatalogEntry(
        code=code,
        name=str(data.get("name") or code),
        keywords=keywords,
        materials=item_materials,
        unit=unit,
        max_length_mm=int(max_length) if max_length not in (None, "") else None,
        min_quantity=_decimal(data.get("min_quantity", 1), where),
        price_breaks=tuple(sorted(breaks, key=lambda b: b.min_quantity)),
    )


def catalog_from_dict(data: Mapping[str, Any]) -> CatalogSpec:
    """Validate a whole catalog definition; ``version`` is a hash of its content."""
    materials = data.get("materials")
    if not isinstance(materials, Mapping) or not materials:
        raise InvalidCatalog("a catalog needs materials: {code: [aliases]}")
    items = tuple(entry_from_dict(item, materials) for item in data.get("items") or ())
    if not items:
        raise InvalidCatalog("a catalog needs at least one item")
    canonical = json.dumps(data, sort_keys=True, default=str)
    return CatalogSpec(
        name=str(data.get("name") or "catalog"),
        currency=str(data.get("currency") or "EUR")[:3],
        materials={
            str(code): tuple(str(a) for a in aliases) for code, aliases in materials.items()
        },
        items=items,
        version=hashlib.sha256(canonical.encode()).hexdigest()[:16],
    )


@lru_cache(maxsize=32)
def catalog_from_document(document: str) -> CatalogSpec:
    """:func:`catalog_from_dict` of a catalog as a JSON document (as a stage reads its
    tenant's catalog), cached by the document's text: a stage reads the catalog on
    every run, and an unchanged one is validated once per process. A changed catalog is
    another text, so nothing stale is ever returned."""
    return catalog_from_dict(json.loads(document))


@cache
def default_catalog() -> CatalogSpec:
    """The catalog shipped as data, for tenants without their own."""
    text = resources.files("pipeline").joinpath("data", "default_catalog.json").read_text()
    return catalog_from_dict(json.loads(text))


def check_position(
    catalog: CatalogSpec,
    *,
    item: str,
    quantity: Decimal,
    unit: str,
    material: str,
    length_mm: int | None,
) -> Verdict:
    """Whether the tenant can make this position, and why (not)."""
    entry = catalog.match(item)
    if entry is None:
        return Verdict(feasible=False, reason=f"no catalog item matches {item[:80]!r}")

    def refuse(reason: str) -> Verdict:
        return Verdict(feasible=False, reason=reason, catalog_item=entry.code)

    if entry.unit == Unit.METRES:
        if unit == Unit.PIECES and length_mm is None:
            return refuse(
                f"{entry.name} is sold by the metre: give the piece length "
                "(e.g. ', 6 m') or order in m"
            )
        if unit not in (Unit.METRES, Unit.PIECES):
            return refuse(f"{entry.name} is sold by m or by pieces with a length, not by {unit}")
    elif unit != entry.unit:
        return refuse(f"{entry.name} is sold by {entry.unit}, not by {unit}")
    note = ""
    if material:
        code = catalog.resolve_material(material)
        if code is None:
            return refuse(f"material {material!r} is not in the catalog")
        if code not in entry.materials:
            available = ", ".join(entry.materials)
            return refuse(f"{entry.name} is not made in {code} (available: {available})")
    else:
        code = entry.materials[0]
        note = f"; material not given, assumed {code}"
    if (
        length_mm is not None
        and entry.max_length_mm is not None
        and (length_mm > entry.max_length_mm)
    ):
        return refuse(f"length {length_mm} mm exceeds the maximum of {entry.max_length_mm} mm")
    priced = priced_quantity(entry, quantity=quantity, unit=unit, length_mm=length_mm)
    if priced < entry.min_quantity:
        counted = f"{quantity.normalize():f} {unit}"
        if priced != quantity:
            counted += f" = {priced.normalize():f} {entry.unit}"
        return refuse(
            f"quantity {counted} is below the minimum of "
            f"{entry.min_quantity.normalize():f} {entry.unit}"
        )
    return Verdict(
        feasible=True, reason="ok" + note, catalog_item=entry.code, catalog_material=code
    )


def priced_quantity(
    entry: CatalogEntry, *, quantity: Decimal, unit: str, length_mm: int | None
) -> Decimal:
    """The position's quantity in the unit ``entry`` is priced in: pieces of a
    metre-priced item count their metres (12 pcs x 6 m = 72 m)."""
    if entry.unit == Unit.METRES and unit == Unit.PIECES and length_mm is not None:
        return quantity * Decimal(length_mm) / Decimal(1000)
    return quantity


def price_position(
    entry: CatalogEntry, *, quantity: Decimal, unit: str, length_mm: int | None
) -> Price:
    """Unit price (per the position's unit) and total, rounded to cents. Quantity breaks
    apply to the quantity in the unit the price is quoted in (:func:`priced_quantity`), so
    12 pcs x 6 m cost what 72 m cost; a piece of a metre-priced item costs price * length."""
    price = entry.price_for(
        priced_quantity(entry, quantity=quantity, unit=unit, length_mm=length_mm)
    )
    if entry.unit == Unit.METRES and unit == Unit.PIECES and length_mm is not None:
        price = price * Decimal(length_mm) / Decimal(1000)
    unit_price = price.quantize(CENT, rounding=ROUND_HALF_UP)
    total = (unit_price * quantity).quantize(CENT, rounding=ROUND_HALF_UP)
    return Price(unit_price=unit_price, total=total)
