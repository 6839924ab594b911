"""A corpus of inquiry files as customers send them (``corpus/``), German and English:
delimiters, encodings (UTF-16 too), units, thousands separators, quoted headers, Markdown
lists and tables, length forms and multi-line fields. Each runs through all four stages;
its positions, warnings and quote are written down here, every price worked out by hand
from the default catalog (``pipeline/data/default_catalog.json``)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

from pipeline.models import Anfrage, ExtractionWarning, PipelineRun, Position
from tests.pipeline.conftest import run_stages, submit

CORPUS = Path(__file__).parent / "corpus"


@dataclass(frozen=True)
class P:
    """An expected position: its line, quantity, unit, item, length, material (as shown),
    and its total (None: not feasible, with ``why`` in its reason)."""

    line: int
    quantity: str
    unit: str
    item: str
    length_mm: int | None
    material: str
    total: str | None
    why: str = ""


EXPECTED: dict[str, dict] = {
    # cp1252, ';', CRLF, every cell quoted, the header too; "Länge (m)" names its unit.
    "de_lieferliste.csv": {
        "positions": [
            # 1200 m >= 200 m: 5.40/m
            P(2, "1200", "m", "Flachstahl 40x5", None, "S235", "6480.00"),
            # 12 x 6.5 m = 78 m >= 50 m: 36.00/m, 234.00 a piece
            P(3, "12", "pcs", "Stahlträger HEA 200", 6500, "S355", "2808.00"),
            # 1500 pcs >= 500: 0.38
            P(4, "1500", "pcs", "Schraube M12x40", None, "1.4301 (V2A)", "570.00"),
        ],
        "warnings": [(2, "'1.200' is read as 1200"), (4, "'1.500' is read as 1500"), (5, "whole")],
        "quote": "9858.00",
    },
    # UTF-8, ',', quoted cells with a comma and a line break; a "length" column whose
    # cells name their unit, except one.
    "en_order.csv": {
        "positions": [
            # 1000 pcs >= 500: 0.38
            P(2, "1000", "pcs", "bolt M12, hex head", None, "S235", "380.00"),
            # 24 x 3 m = 72 m >= 20 m: 16.90/m, 50.70 a piece
            P(3, "24", "pcs", "steel pipe 60.3x2.9 galvanised", 3000, "S355", "1216.80"),
            # 1250.5 m >= 200 m: 5.40/m
            P(5, "1250.5", "m", "flat bar 30x5", None, "S235 (assumed)", "6752.70"),
            # 8 x 2 m = 16 m: 9.40/m, 18.80 a piece
            P(6, "8", "pcs", "angle 50x5", 2000, "S235", "150.40"),
            # "6" under a header without a unit: left out, so the beam has no length
            P(7, "3", "pcs", "steel beam HEB 300", None, "S235", None, "give the piece length"),
        ],
        "warnings": [(2, "'1,000' is read as 1000"), (7, "no unit")],
        "quote": "8499.90",
    },
    # German text lines with labels, comments and a line that is no item.
    "anfrage_bau.txt": {
        "positions": [
            # 12 x 6 m = 72 m >= 50 m: 36.00/m, 216.00 a piece
            P(2, "12", "pcs", "Stahlträger HEB 300 S355J2", 6000, "S355 (S355J2)", "2592.00"),
            # 1234.5 m >= 200 m: 5.40/m
            P(3, "1234.5", "m", "Flachstahl 40x5", None, "S235 (steel)", "6666.30"),
            # 2.5 t = 2500 kg >= 1000 kg: 1.18/kg
            P(4, "2500", "kg", "Betonstahl", None, "S235 (steel)", "2950.00"),
            # 200 pcs >= 50: 0.45
            P(5, "200", "pcs", "Schrauben M12x40 V2A", None, "1.4301 (stainless)", "90.00"),
            # 4 x 8 m = 32 m >= 10 m: 39.50/m, 316.00 a piece
            P(6, "4", "pcs", "Träger IPE 240", 8000, "S235 (assumed)", "1264.00"),
            # 12 000 m >= 200 m: 5.40/m
            P(8, "12000", "m", "Flachstahl 30x5", None, "S235 (steel)", "64800.00"),
        ],
        "warnings": [(7, "expected a quantity first"), (8, "read as one number, 12000")],
        "quote": "78362.30",
    },
    # English Markdown: prose around a list of three marker kinds.
    "inquiry.md": {
        "positions": [
            # 1250 m >= 200 m: 5.40/m
            P(5, "1250", "m", "flat bar 40x5 aluminium", None, "AlMg3 (aluminium)", "6750.00"),
            # 12 x 6 m = 72 m >= 20 m: 16.90/m, 101.40 a piece
            P(6, "12", "pcs", "steel pipe 60.3x2.9", 6000, "S235 (steel)", "1216.80"),
            # 40 pcs >= 10: 52.00
            P(
                7,
                "40",
                "pcs",
                "hot-dip galvanised plate 1500x3000",
                None,
                "S235 (assumed)",
                "2080.00",
            ),
            # 3 x 6 m = 18 m >= 10 m: 39.50/m, 237.00 a piece
            P(8, "3", "pcs", "steel beam HEA 200", 6000, "S235 (steel)", "711.00"),
        ],
        "warnings": [(5, "'1,250' is read as 1250"), (9, "whole")],
        "quote": "10757.80",
    },
    # UTF-8 with one Windows-1252 line: only that line is read as Windows-1252.
    "gemischt.txt": {
        "positions": [
            # 4 x 6 m = 24 m >= 10 m: 39.50/m, 237.00 a piece
            P(1, "4", "pcs", "Träger HEA 200", 6000, "S235 (assumed)", "948.00"),
            # 2 x 3 m = 6 m: 18.50/m, 55.50 a piece
            P(2, "2", "pcs", "Rohr für Geländer", 3000, "S235 (assumed)", "111.00"),
            # 10 m: 6.80/m
            P(3, "10", "m", "Flachstahl 40x5 Edelstahl", None, "1.4301 (stainless)", "68.00"),
        ],
        "warnings": [(2, "not UTF-8")],
        "quote": "1127.00",
    },
    # Tab separated, UTF-8 with BOM, CRLF, a quoted item over two lines.
    "tab_liste.csv": {
        "positions": [
            # 6 x 6 m = 36 m >= 20 m: 16.90/m, 101.40 a piece
            P(2, "6", "pcs", "Rohr 60x4 verzinkt", 6000, "S235 (assumed)", "608.40"),
            # 250 kg >= 100 kg: 1.35/kg
            P(5, "250", "kg", "Schrott", None, "S235 (assumed)", "337.50"),
        ],
        "warnings": [(4, "'x' is not a number")],
        "quote": "945.90",
    },
    # A Markdown table (header in capitals, aligned delimiter row, an escaped pipe in a
    # cell) between prose, and a list item of pieces of a length.
    "tabelle.md": {
        "positions": [
            # 6,250 in a column in metres is 6.25 m; 12 x 6.25 m = 75 m >= 50 m: 36.00/m
            P(7, "12", "pcs", "Träger HEA 200", 6250, "S355", "2700.00"),
            # 1500 m >= 200 m: 5.40/m
            P(8, "1500", "m", "Flachstahl 40x5", None, "S235 (steel)", "8100.00"),
            # 300 pcs >= 50: 0.45
            P(10, "300", "pcs", "Schraube M12 | verzinkt", None, "1.4301 (V2A)", "135.00"),
            # 2 x 6 m = 12 m: 18.50/m, 111.00 a piece
            P(12, "2", "pcs", "Rohr 60x4 verzinkt", 6000, "S235 (assumed)", "222.00"),
        ],
        "warnings": [(8, "'1.500' is read as 1500"), (9, "'zwölf' is not a number")],
        "quote": "11157.00",
    },
    # Every length form of a text line: single and total lengths, lfm, pieces x length,
    # a length without its unit, a quantity ending in a separator, 5,750 m.
    "laengen.txt": {
        "positions": [
            # 12 x 6 m = 72 m >= 50 m: 36.00/m
            P(1, "12", "pcs", "Träger HEB 300", 6000, "S235 (assumed)", "2592.00"),
            # 4 x 6 m = 24 m >= 20 m: 16.90/m
            P(2, "4", "pcs", "Rohr 60x4", 6000, "S235 (assumed)", "405.60"),
            # 12 x 6 m = 72 m >= 20 m: 16.90/m
            P(3, "12", "pcs", "Rohr 40x3", 6000, "S235 (assumed)", "1216.80"),
            # 64 m shared by 8 pieces: 8 m each; 64 m >= 50 m: 36.00/m
            P(4, "8", "pcs", "Träger IPE 240", 8000, "S235 (assumed)", "2304.00"),
            # "L=6000" names no unit: left out, so the beam has no length
            P(
                5,
                "4",
                "pcs",
                "Träger HEA 200",
                None,
                "",
                None,
                "give the piece length",
            ),
            # 30 x 5.75 m = 172.5 m >= 100 m: 15.20/m
            P(7, "30", "pcs", "Rohr 40x3", 5750, "S235 (assumed)", "2622.00"),
        ],
        "warnings": [(5, "'L=6000' names no unit"), (6, "ends in a separator")],
        "quote": "9140.40",
    },
    # UTF-16 with its BOM, CRLF, ';'.
    "utf16_liste.csv": {
        "positions": [
            # 6 x 6 m = 36 m >= 10 m: 39.50/m
            P(2, "6", "pcs", "Träger HEA 200", 6000, "S235 (assumed)", "1422.00"),
            # 250 kg >= 100 kg: 1.35/kg
            P(3, "250", "kg", "Betonstahl", None, "S235 (steel)", "337.50"),
        ],
        "warnings": [],
        "quote": "1759.50",
    },
    # Copied from a word processor: a no-break space (a narrow one too) between a number
    # and its unit, between a thousand and its hundreds, and inside the item; a vulgar
    # fraction and a range in words.
    "word_kopie.txt": {
        "positions": [
            # 12 m < 50 m: 6.80/m
            P(1, "12", "m", "Flachstahl 40x5", None, "S235 (steel)", "81.60"),
            # 4 x 6 m = 24 m >= 10 m: 39.50/m, 237.00 a piece
            P(2, "4", "pcs", "Träger HEA 200", 6000, "S235 (assumed)", "948.00"),
            # 1250 kg >= 1000 kg: 1.18/kg
            P(3, "1250", "kg", "Betonstahl", None, "S235 (steel)", "1475.00"),
        ],
        "warnings": [(4, "'2½' reads as a range or a fraction"), (5, "'200 bis 3")],
        "quote": "2504.60",
    },
    # Excel's "Unicode Text" export: UTF-16, tab separated, a header row, saved as .txt.
    "excel_unicode.txt": {
        "positions": [
            # 12 x 6 m = 72 m >= 50 m: 36.00/m, 216.00 a piece
            P(2, "12", "pcs", "Träger HEA 200", 6000, "S235 (assumed)", "2592.00"),
            # 1200 m >= 200 m: 5.40/m
            P(3, "1200", "m", "Flachstahl 40x5", None, "S235 (steel)", "6480.00"),
        ],
        "warnings": [(3, "'1.200' is read as 1200")],
        "quote": "9072.00",
    },
    # Units the catalog does not sell by (area, feet, inches), and a position number
    # before the quantity: refused, not pieces.
    "einheiten.txt": {
        "positions": [
            # 6 pcs < 10: 58.00
            P(5, "6", "pcs", "Blech 1000x2000x3", None, "S235 (assumed)", "348.00"),
        ],
        "warnings": [(1, "'m²'"), (2, "'qm'"), (3, "'ft'"), (4, "inches"), (6, "two numbers")],
        "quote": "348.00",
    },
    # UTF-16 (little-endian) without a BOM: its NUL bytes tell.
    "utf16_ohne_bom.txt": {
        "positions": [
            # 3 x 8 m = 24 m >= 10 m: 39.50/m
            P(1, "3", "pcs", "Träger IPE 240", 8000, "S235 (assumed)", "948.00"),
            # 20 m < 50 m: 6.80/m
            P(2, "20", "m", "Flachstahl 30x5 Edelstahl", None, "1.4301 (stainless)", "136.00"),
        ],
        "warnings": [],
        "quote": "1084.00",
    },
}


def test_the_corpus_is_complete():
    assert sorted(p.name for p in CORPUS.iterdir() if not p.name.startswith(".")) == sorted(
        EXPECTED
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_corpus_file_through_all_four_stages(tenant, name):
    expected = EXPECTED[name]
    anfrage = submit(tenant, {name: (CORPUS / name).read_bytes()})
    run_stages(anfrage.id)
    assert set(PipelineRun.objects.filter(anfrage=anfrage).values_list("status", flat=True)) == {
        "success"
    }
    positions = list(Position.objects.filter(anfrage=anfrage).order_by("position_index"))
    assert [
        P(
            p.source_line,
            f"{p.quantity.normalize():f}",
            p.unit,
            p.item,
            p.length_mm,
            p.material_shown,
            None if p.total is None else str(p.total),
            expected["positions"][i].why if not p.feasible else "",
        )
        for i, p in enumerate(positions)
    ] == expected["positions"]
    for position, want in zip(positions, expected["positions"], strict=True):
        assert want.why in position.reason
    warnings = list(ExtractionWarning.objects.filter(anfrage=anfrage).order_by("id"))
    assert [w.line_no for w in warnings] == [line for line, _ in expected["warnings"]]
    for warning, (_, text) in zip(warnings, expected["warnings"], strict=True):
        assert text in warning.message
    anfrage = Anfrage.objects.get(pk=anfrage.id)
    assert anfrage.quote_total == Decimal(expected["quote"])
    assert anfrage.quote_total == sum(p.total for p in positions if p.total is not None)
    assert anfrage.completed_at is not None
