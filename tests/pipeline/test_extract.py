"""The default extractor and upload inspection: pure functions, no database."""

from __future__ import annotations

import codecs
from decimal import Decimal

import pytest

from pipeline.exceptions import BinaryFile, EmptyFile, UnknownFormat
from pipeline.extract import LineError, LineExtractor, inspect_upload, parse_item_line
from pipeline.models import FileFormat, Unit


@pytest.mark.parametrize(
    ("line", "quantity", "unit", "item", "material", "length_mm"),
    [
        ("12 pcs steel beam HEA 200, 6 m", "12", Unit.PIECES, "steel beam HEA 200", "steel", 6000),
        (
            "12 Stk. Stahlträger HEB 300 S355J2, 6000 mm",
            "12",
            Unit.PIECES,
            "Stahlträger HEB 300 S355J2",
            "S355J2",
            6000,
        ),
        ("4 Stück Träger IPE 240 L=8000 mm", "4", Unit.PIECES, "Träger IPE 240", "", 8000),
        ("30 m Flachstahl 40x5", "30", Unit.METRES, "Flachstahl 40x5", "steel", None),
        ("250 cm angle 40x4", "2.5", Unit.METRES, "angle 40x4", "", None),
        ("2,5 t Betonstahl", "2500", Unit.KILOGRAMS, "Betonstahl", "steel", None),
        (
            "Pos 3: 200 Stück Schrauben M12x40 V2A",
            "200",
            Unit.PIECES,
            "Schrauben M12x40 V2A",
            "stainless",
            None,
        ),
        (
            "12x steel pipe 60.3x2.9 length 6 m",
            "12",
            Unit.PIECES,
            "steel pipe 60.3x2.9",
            "steel",
            6000,
        ),
        ("12 steel beams", "12", Unit.PIECES, "steel beams", "steel", None),
        (
            "5 lfm Edelstahlrohr 1.4571, je 3 m",
            "5",
            Unit.METRES,
            "Edelstahlrohr 1.4571",
            "1.4571",
            3000,
        ),
    ],
)
def test_item_lines_in_german_and_english(line, quantity, unit, item, material, length_mm):
    fields = parse_item_line(line)
    assert fields["quantity"] == Decimal(quantity)
    assert fields["unit"] == unit
    assert fields["item"] == item
    assert fields["material"] == material
    assert fields["length_mm"] == length_mm


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("hello world", "expected a quantity first"),
        ("0 pcs steel beam", "must be positive"),
        ("12 pcs", "names no item"),
        ("12 pcs beam, 0 m", "out of range"),
    ],
)
def test_lines_that_do_not_parse_say_why(line, message):
    with pytest.raises(LineError, match=message):
        parse_item_line(line)


def test_text_file_yields_good_positions_and_a_warning_per_bad_line():
    source = inspect_upload(
        "items.txt",
        b"# a comment\n12 pcs steel beam HEA 200, 6 m\nplease call me\n\n3 m Rohr 60x4\nzero 0\n",
    )
    result = LineExtractor().extract(source)
    assert [p.line_no for p in result.positions] == [2, 5]
    assert [(w.line_no, w.line) for w in result.warnings] == [(3, "please call me"), (6, "zero 0")]


def test_csv_with_header_and_a_bad_row():
    text = (
        "position;qty;unit;item;material;length_mm\n"
        "1;12;Stk;Stahlträger HEA 200;S235;6000\n"
        "2;x;pcs;beam;;\n"
        "3;2,5;m;Flachstahl 40x5;;\n"
        "4;1\n"
    )
    result = LineExtractor().extract(inspect_upload("list.csv", text.encode()))
    assert [(p.label, p.quantity, p.unit, p.material, p.length_mm) for p in result.positions] == [
        ("1", Decimal("12.000"), Unit.PIECES, "S235", 6000),
        ("3", Decimal("2.500"), Unit.METRES, "steel", None),
    ]
    assert [(w.line_no, w.message) for w in result.warnings] == [
        (3, "'x' is not a number"),
        (5, "expected 6 columns, got 2"),
    ]


def test_csv_with_german_header_and_commas():
    text = "Pos,Menge,Einheit,Bezeichnung,Werkstoff,Länge_mm\n1,4,Stk,Rohr 60x4,1.4301,3000\n"
    result = LineExtractor().extract(inspect_upload("liste.csv", text.encode()))
    assert [(p.item, p.material, p.length_mm) for p in result.positions] == [
        ("Rohr 60x4", "1.4301", 3000)
    ]


def test_csv_without_header_is_one_warning():
    result = LineExtractor().extract(inspect_upload("list.csv", b"1;12;pcs;beam\n"))
    assert result.positions == ()
    assert "header" in result.warnings[0].message


def test_markdown_reads_list_items_and_ignores_prose():
    text = (
        "# Anfrage 2024-17\n\nBitte um Angebot für:\n\n"
        "- 12 pcs steel beam HEA 200, 6 m\n"
        "* not an item\n"
        "1. 40 m Flachstahl 40x5\n"
    )
    result = LineExtractor().extract(inspect_upload("anfrage.md", text.encode()))
    assert [p.line_no for p in result.positions] == [5, 7]
    assert [w.line_no for w in result.warnings] == [6]


@pytest.mark.parametrize(
    ("name", "data", "error"),
    [
        ("empty.txt", b"", EmptyFile),
        ("blank.txt", b"  \n\n", EmptyFile),
        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", UnknownFormat),
        ("image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", BinaryFile),
        ("nul.txt", b"12 pcs beam\x00\x00", BinaryFile),
        ("items.pdf", b"12 pcs steel beam", UnknownFormat),
        ("items.xlsx", b"12 pcs steel beam", UnknownFormat),
    ],
)
def test_inspect_upload_refuses_bad_files(name, data, error):
    with pytest.raises(error, match=name.replace(".", r"\.")):
        inspect_upload(name, data)


def test_inspect_upload_decodes_windows_1252_and_sniffs_formats():
    assert inspect_upload("liste.txt", "4 Stück Träger".encode("cp1252")).text == "4 Stück Träger"
    assert inspect_upload("noext", b"qty;item\n1;beam\n").format == FileFormat.CSV
    assert inspect_upload("noext", b"Hello\n- 1 pcs beam\n").format == FileFormat.MARKDOWN
    assert inspect_upload("noext", b"1 pcs beam\n").format == FileFormat.TEXT


MARKDOWN_TABLE = (
    "# Anfrage\n"
    "\n"
    "| Pos | Menge | Einheit | Bezeichnung | Länge (m) |\n"
    "|---|--:|:---:|---|---|\n"
    "| 1 | 12 | Stk | Träger HEA 200 | 6 |\n"
    "| 2 | 1.200 | m | Flachstahl 40x5 | |\n"
    "| 3 | x | Stk | Rohr | |\n"
    "| 4 | 2 | Stk | Blech \\| 2 mm | |\n"
    "\n"
    "- 3 pcs bolt M12\n"
)


@pytest.mark.parametrize("name", ["anfrage.md", "anfrage.txt", "anfrage"])
def test_a_markdown_table_is_read_as_a_delimited_table(name):
    result = LineExtractor().extract(inspect_upload(name, MARKDOWN_TABLE.encode()))
    assert [
        (p.line_no, p.label, p.quantity, p.unit, p.item, p.length_mm) for p in result.positions
    ] == [
        (5, "1", Decimal(12), "pcs", "Träger HEA 200", 6000),
        (6, "2", Decimal(1200), "m", "Flachstahl 40x5", None),
        (8, "4", Decimal(2), "pcs", "Blech | 2 mm", None),
        (10, "", Decimal(3), "pcs", "bolt M12", None),
    ]
    assert [(w.line_no, w.message) for w in result.warnings] == [
        (
            6,
            "quantity: '1.200' is read as 1200 ('.' separating thousands); write 1200, or 1,2 "
            "for a decimal",
        ),
        (7, "'x' is not a number"),
    ]


def test_a_markdown_table_without_qty_and_item_columns_warns_per_row():
    text = "| Name | Telefon |\n|---|---|\n| Jane | 0123 |\n| Joe | 0456 |\n"
    result = LineExtractor().extract(inspect_upload("kontakt.md", text.encode()))
    assert result.positions == ()
    assert [w.line_no for w in result.warnings] == [1, 3, 4]
    assert all("names no qty and item column" in w.message for w in result.warnings)


def test_a_markdown_table_row_with_too_few_cells_warns():
    text = "| Menge | Bezeichnung | Einheit |\n|---|---|---|\n| 4 | Rohr |\n"
    result = LineExtractor().extract(inspect_upload("a.md", text.encode()))
    assert result.positions == ()
    assert [(w.line_no, w.message) for w in result.warnings] == [(3, "expected 3 columns, got 2")]


UTF16_TEXT = "Menge;Einheit;Bezeichnung\n4;Stück;Träger HEA 200\n2;m;Rohr für Geländer\n"


@pytest.mark.parametrize(
    "data",
    [
        UTF16_TEXT.encode("utf-16"),  # with its BOM (little-endian here)
        codecs.BOM_UTF16_BE + UTF16_TEXT.encode("utf-16-be"),
        UTF16_TEXT.encode("utf-16-le"),  # no BOM: the NUL pattern tells
        UTF16_TEXT.encode("utf-16-be"),
    ],
    ids=["bom", "bom-be", "le", "be"],
)
def test_a_utf16_file_is_decoded(data):
    source = inspect_upload("liste.csv", data)
    assert source.text == UTF16_TEXT
    result = LineExtractor().extract(source)
    assert [p.item for p in result.positions] == ["Träger HEA 200", "Rohr für Geländer"]
    assert result.warnings == ()


def test_binary_with_nul_bytes_is_still_binary():
    with pytest.raises(BinaryFile):
        inspect_upload("x.txt", bytes(range(256)) * 4)
    with pytest.raises(BinaryFile):
        inspect_upload("x.txt", "12 pcs beam".encode("utf-16-le") + b"\x00\x00\x00\x00\x01\x02")


def test_header_names_units_and_keywords_are_read_in_any_case():
    text = "POS.;MENGE;EINHEIT;BEZEICHNUNG;WERKSTOFF;LÄNGE (M)\n1;2;STÜCK;Rohr;S355;6\n"
    (position,) = LineExtractor().extract(inspect_upload("a.csv", text.encode())).positions
    assert (position.label, position.unit, position.material, position.length_mm) == (
        "1",
        "pcs",
        "S355",
        6000,
    )
    (line,) = (
        LineExtractor()
        .extract(inspect_upload("a.txt", "POS 3: 12 STK. Rohr EINZELLÄNGE 6 M\n".encode()))
        .positions
    )
    assert (line.label, line.quantity, line.item, line.length_mm) == ("3", 12, "Rohr", 6000)
