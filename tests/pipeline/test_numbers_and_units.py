"""Numbers, units and lengths as inquiries write them: thousands separators in both
locales, length columns with their units, prices by the unit they are quoted in, and the
smaller traps (quoted headers, fractional pieces, mixed encodings, multi-line fields).
Pure functions, no database."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.catalog import catalog_from_dict, check_position, default_catalog, price_position
from pipeline.extract import LineError, LineExtractor, inspect_upload, parse_item_line, read_number
from pipeline.models import Unit


def extract(name: str, data: str | bytes):
    source = inspect_upload(name, data.encode() if isinstance(data, str) else data)
    result = LineExtractor().extract(source)
    return source, result


# --- thousands separators


@pytest.mark.parametrize(
    ("line", "quantity", "unit", "item"),
    [
        ("1.200 m Flachstahl 40x5", "1200", Unit.METRES, "Flachstahl 40x5"),
        ("1.000 Stk Schraube M12", "1000", Unit.PIECES, "Schraube M12"),
        ("1,000 pcs bolt M12", "1000", Unit.PIECES, "bolt M12"),
        ("1.234,5 m Flachstahl", "1234.5", Unit.METRES, "Flachstahl"),
        ("1,234.5 m flat bar", "1234.5", Unit.METRES, "flat bar"),
        ("1.234.567 kg Schrott", "1234567", Unit.KILOGRAMS, "Schrott"),
        ("1'250 m flat bar", "1250", Unit.METRES, "flat bar"),
        ("1\u00a0250,5 m Flachstahl", "1250.5", Unit.METRES, "Flachstahl"),
        ("2,5 m Flachstahl", "2.5", Unit.METRES, "Flachstahl"),
        ("2.75 m flat bar", "2.75", Unit.METRES, "flat bar"),
        ("0,500 t Betonstahl", "500", Unit.KILOGRAMS, "Betonstahl"),
        ("12.5000 m flat bar", "12.5", Unit.METRES, "flat bar"),
    ],
)
def test_thousands_separators_in_both_locales(line, quantity, unit, item):
    fields = parse_item_line(line)
    assert (fields["quantity"], fields["unit"], fields["item"]) == (Decimal(quantity), unit, item)


@pytest.mark.parametrize(
    ("line", "quantity"),
    [
        ("1.200 m Flachstahl 40x5", "1200"),
        ("1,000 pcs bolt M12", "1000"),
        ("12 000 m Flachstahl", "12000"),
        # Space-grouped with a decimal part (SI style): was 12 pieces of "345,5 m Flachstahl".
        ("12 345,5 m Flachstahl", "12345.5"),
        ("1 500.25 m flat bar", "1500.25"),
    ],
)
def test_an_ambiguous_quantity_is_read_as_thousands_and_warned_about(line, quantity):
    _, result = extract("items.txt", f"{line}\n")
    (position,) = result.positions
    assert position.quantity == Decimal(quantity)
    (warning,) = result.warnings
    assert warning.line_no == 1
    assert quantity in warning.message
    assert "decimal" in warning.message or "without spaces" in warning.message


@pytest.mark.parametrize(
    ("line", "item"),
    [('12 ½" Rohrschelle', '½" Rohrschelle'), ('2 Stk Rohr 1/2"', 'Rohr 1/2"')],
)
def test_a_fraction_apart_from_the_quantity_is_part_of_the_item(line, item):
    fields = parse_item_line(line)
    assert (fields["quantity"], fields["item"]) == (Decimal(int(line.split()[0])), item)


@pytest.mark.parametrize(
    ("line", "quantity", "unit", "item", "length_mm"),
    [
        # Was 12 pieces of "\u00a0m Flachstahl", without a warning.
        ("12\u00a0m Flachstahl", "12", Unit.METRES, "Flachstahl", None),
        ("12\u202fm Rohr", "12", Unit.METRES, "Rohr", None),
        ("1\u00a0234\u00a0kg Betonstahl", "1234", Unit.KILOGRAMS, "Betonstahl", None),
        ("12 Stk\u00a0Träger HEA\u00a0200", "12", Unit.PIECES, "Träger HEA 200", None),
        # Was a beam without a length, its "6\u00a0m" left in the item.
        ("12 Stk Träger HEA 200, 6\u00a0m", "12", Unit.PIECES, "Träger HEA 200", 6000),
        ("12 Stk Träger,\u00a06,5\u202fm", "12", Unit.PIECES, "Träger", 6500),
        ("2\u00a0x\u00a06\u00a0m Rohr", "2", Unit.PIECES, "Rohr", 6000),
        # Invisible characters copied from web pages: a zero-width space is a space; a
        # soft hyphen, a word joiner and a BOM are nothing. These were 12 pieces of
        # "m\u200b Rohr", 1 piece of "\u00ad200 m Rohr", a line that did not read.
        ("12 m\u200b Rohr", "12", Unit.METRES, "Rohr", None),
        ("12\u200bm Rohr", "12", Unit.METRES, "Rohr", None),
        ("1\u00ad200 m Rohr", "1200", Unit.METRES, "Rohr", None),
        ("\ufeff13 Stk Rohr, 6\u2060m", "13", Unit.PIECES, "Rohr", 6000),
    ],
)
def test_a_no_break_space_outside_a_number_is_a_space_and_invisibles_are_none(
    line, quantity, unit, item, length_mm
):
    fields = parse_item_line(line)
    assert (fields["quantity"], fields["unit"], fields["item"], fields["length_mm"]) == (
        Decimal(quantity),
        unit,
        item,
        length_mm,
    )
    assert fields["notes"] == []


@pytest.mark.parametrize(
    "line",
    [
        "2-3 Stk Schraube M12",
        "1/2 m Rohr",
        "2 \u2013 3 Stk Rohr",
        # These were 2 pieces of "½ m Rohr", 200 pieces of "bis 300 Stk Schraube M12", ...
        "2½ m Rohr",
        "2\u00bc Stk Blech",
        "200 bis 300 Stk Schraube M12",
        "200 to 300 pcs bolt M12",
        "4 BIS 6 m Rohr",
    ],
)
def test_a_range_or_fraction_of_quantities_is_refused(line):
    # "2-3 Stk Schraube" was 2 pieces of an item "3 Stk Schraube M12", without a warning.
    with pytest.raises(LineError, match="a range or a fraction"):
        parse_item_line(line)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        # Each was that many pieces of the rest ("12 pcs of 'm² Blech'"): a sheet is
        # priced by the piece, so 12 m² were quoted as 12 plates, without a warning.
        ("12 m² Blech 2 mm", "unit 'm²'"),
        ("12 m2 Blech 2 mm", "unit 'm2'"),
        ("3 qm Blech", "unit 'qm'"),
        ("2 m³ Sand", "unit 'm³'"),
        ("20 ft steel pipe", "unit 'ft'"),
        ("100 lbs bolts", "unit 'lbs'"),
        ('10" Rohr', "inches"),
        ("10\u2033 Rohr", "inches"),
        ("20' pipe", "feet"),
    ],
)
def test_a_unit_the_catalog_does_not_sell_by_is_refused(line, message):
    with pytest.raises(LineError, match=message):
        parse_item_line(line)


@pytest.mark.parametrize(
    "line",
    [
        # A position number, then the quantity: was 1 piece of "12 Stk Träger HEA 200"
        # (and 3 plates of "12 Stk Blech" were priced as 3), without a warning.
        "1 12 Stk Träger HEA 200",
        "1\t12\tStk\tTräger",
        "3 12 Stk Blech 1000x2000",
        "2 25 kg Schrott",
        # Packs and sums: were 3 plates of "12 Stk Blech", 5 pieces of "x100 Stk …", 12
        # pieces of "+2 Stk Blech".
        "3 x 12 Stk Blech 1000x2000",
        "5x100 Stk Schraube M12",
        "12+2 Stk Blech 1000x2000",
        "12 + 2 Stk Blech 1000x2000",
    ],
)
def test_a_count_before_a_quantity_with_its_unit_is_refused(line):
    with pytest.raises(LineError, match="two numbers before"):
        parse_item_line(line)


@pytest.mark.parametrize(
    ("line", "item"),
    [
        ("12 40 x 5 Flachstahl", "40 x 5 Flachstahl"),
        ("12 10 mm Blech", "10 mm Blech"),
        ("12 1.4301 Schraube", "1.4301 Schraube"),
    ],
)
def test_a_number_that_describes_the_item_stays_in_it(line, item):
    assert parse_item_line(line)["item"] == item


@pytest.mark.parametrize("line", ["0,0004 m Rohr", "0.1 mm Draht"])
def test_a_quantity_that_rounds_to_zero_is_refused(line):
    # Quantities are kept to 0.001 of their unit: these were positions of 0.000 m.
    with pytest.raises(LineError, match="must be positive"):
        parse_item_line(line)


def test_unambiguous_numbers_carry_no_warning():
    _, result = extract("items.txt", "1.234,5 m Flachstahl\n2,5 m flat bar\n1,234.5 m flat bar\n")
    assert len(result.positions) == 3
    assert result.warnings == ()


@pytest.mark.parametrize("text", ["1.2.3", "1,23,456", "1.234,5,6", "12,34.567,8", "1'23"])
def test_badly_grouped_numbers_are_refused(text):
    with pytest.raises(LineError, match="is not a number"):
        read_number(text)


def test_a_space_grouped_csv_quantity_is_read_as_in_a_text_line():
    # '12 000' in a qty cell was refused ("not a number"), while a text line reads it.
    _, result = extract("list.csv", "qty;unit;item\n12 000;m;Flachstahl\n12 345,5;m;Draht\n")
    assert [p.quantity for p in result.positions] == [Decimal("12000"), Decimal("12345.5")]
    assert [w.line_no for w in result.warnings] == [2, 3]
    assert "read as one number, 12000" in result.warnings[0].message


def test_thousands_in_a_csv_quantity_column():
    _, result = extract(
        "list.csv", "qty;unit;item\n1.200;m;Flachstahl 40x5\n1.234,5;m;Flachstahl 30x5\n"
    )
    assert [p.quantity for p in result.positions] == [Decimal("1200"), Decimal("1234.5")]
    assert [w.line_no for w in result.warnings] == [2]


# --- the length column of a CSV


@pytest.mark.parametrize(
    ("header", "cell", "length_mm"),
    [
        ("Länge", "6 m", 6000),
        ("laenge", "2000 mm", 2000),
        ("length", "6,5 m", 6500),
        ("length", "250 cm", 2500),
        ("Länge (m)", "6", 6000),
        ("Länge [m]", "6,5", 6500),
        ("Länge in mm", "6000", 6000),
        ("length_mm", "6000", 6000),
        ("länge_mm", "6 m", 6000),
    ],
)
def test_a_length_column_takes_the_unit_of_its_cells_or_header(header, cell, length_mm):
    _, result = extract(
        "list.csv", f"Menge;Einheit;Bezeichnung;{header}\n4;Stk;Träger HEA 200;{cell}\n"
    )
    assert [p.length_mm for p in result.positions] == [length_mm]
    assert result.warnings == ()


@pytest.mark.parametrize(
    ("header", "length_mm"),
    [
        ("Länge (Meter)", 6000),
        ("Länge in Meter", 6000),
        ("Länge [Millimeter]", 6),
        ("Länge/mm", 6),
        ("Length (metres)", 6000),
        ("length in cm", 60),
    ],
)
def test_a_length_header_may_spell_its_unit_out(header, length_mm):
    # Such a column was not taken for the length at all: its cells were dropped silently.
    _, result = extract("list.csv", f"Menge;Einheit;Bezeichnung;{header}\n4;Stk;Träger;6\n")
    assert [p.length_mm for p in result.positions] == [length_mm]
    assert result.warnings == ()


def test_a_bare_length_without_any_unit_is_an_ambiguity_not_millimetres():
    _, result = extract("list.csv", "Menge;Einheit;Bezeichnung;Länge\n4;Stk;Träger HEA 200;6\n")
    (position,) = result.positions
    assert position.length_mm is None
    (warning,) = result.warnings
    assert "no unit" in warning.message
    # Without a length, a beam in pieces is not priced: feasibility asks for the length.
    verdict = check_position(
        default_catalog(),
        item=position.item,
        quantity=position.quantity,
        unit=position.unit,
        material="",
        length_mm=position.length_mm,
    )
    assert not verdict.feasible
    assert "give the piece length" in verdict.reason


def test_a_fractional_millimetre_is_rounded_with_a_warning():
    _, result = extract("list.csv", "qty;unit;item;length_mm\n4;Stk;Rohr 60x4;2500,5\n")
    assert [p.length_mm for p in result.positions] == [2501]
    assert "rounded to 2501 mm" in result.warnings[0].message


# --- prices and minimum quantities by the unit the price is quoted in


def test_quantity_breaks_of_metre_priced_pieces_count_metres():
    beam = default_catalog().entry("beam")
    pieces = price_position(beam, quantity=Decimal(12), unit=Unit.PIECES, length_mm=6000)
    metres = price_position(beam, quantity=Decimal(72), unit=Unit.METRES, length_mm=None)
    # 72 m reach the 50 m break at 36.00/m: one piece of 6 m costs 216.00.
    assert (pieces.unit_price, pieces.total) == (Decimal("216.00"), Decimal("2592.00"))
    assert (metres.unit_price, metres.total) == (Decimal("36.00"), Decimal("2592.00"))
    # 2 pieces of 6 m are 12 m: the 10 m break at 39.50/m.
    two = price_position(beam, quantity=Decimal(2), unit=Unit.PIECES, length_mm=6000)
    assert (two.unit_price, two.total) == (Decimal("237.00"), Decimal("474.00"))


def test_the_minimum_quantity_of_metre_priced_pieces_counts_metres():
    catalog = catalog_from_dict(
        {
            "materials": {"S235": ["steel"]},
            "items": [
                {
                    "code": "beam",
                    "keywords": ["beam"],
                    "materials": ["S235"],
                    "unit": "m",
                    "min_quantity": "10",
                    "price_breaks": [["10", "40.00"]],
                }
            ],
        }
    )

    def check(quantity: int, length_mm: int):
        return check_position(
            catalog,
            item="beam",
            quantity=Decimal(quantity),
            unit=Unit.PIECES,
            material="",
            length_mm=length_mm,
        )

    assert check(3, 6000).feasible  # 18 m
    refused = check(3, 3000)  # 9 m
    assert not refused.feasible
    assert "3 pcs = 9 m is below the minimum of 10 m" in refused.reason


# --- smaller traps


def test_cells_past_the_header_are_warned_about():
    # An unquoted comma in an English CSV: "S355" fell into a cell no column names, and
    # the flat bar was quoted in the assumed S235, without a warning. Empty cells past
    # the header (as spreadsheets write them) need none.
    _, result = extract("order.csv", "qty,unit,item\n12,m,flat bar 40x5, S355\n4,m,tube,,\n")
    assert [(p.item, p.material) for p in result.positions] == [
        ("flat bar 40x5", ""),
        ("tube", ""),
    ]
    assert [(w.line_no, w.message) for w in result.warnings] == [
        (
            2,
            "the row has 4 cells, its header 3: ' S355' is not read; quote a cell that "
            "holds the delimiter",
        )
    ]


def test_a_csv_with_a_quoted_header_is_read():
    text = (
        '"Position";"Menge";"Einheit";"Bezeichnung";"Länge"\n"1";"4";"Stk";"Träger HEA 200";"6 m"\n'
    )
    _, result = extract("liste.csv", text)
    assert [(p.label, p.quantity, p.item, p.length_mm) for p in result.positions] == [
        ("1", Decimal(4), "Träger HEA 200", 6000)
    ]


@pytest.mark.parametrize(
    ("name", "delimiter"), [("liste.csv", ";"), ("liste", ","), ("a.txt", "\t")]
)
def test_excels_separator_line_names_the_delimiter(name, delimiter):
    # Excel writes "sep=;" before the header when asked to; the file had no header then.
    rows = [
        "sep=" + delimiter,
        delimiter.join(["Menge", "Einheit", "Bezeichnung"]),
        "12;Stk;Träger",
    ]
    text = "\r\n".join(rows).replace(";", delimiter) + "\r\n"
    _, result = extract(name, text)
    assert [(p.line_no, p.quantity, p.item) for p in result.positions] == [
        (3, Decimal(12), "Träger")
    ]
    assert result.warnings == ()


def test_a_quoted_header_is_sniffed_as_csv():
    source = inspect_upload("liste", b'"Menge";"Bezeichnung"\n4;Rohr\n')
    assert source.format == "csv"


@pytest.mark.parametrize(
    "data",
    [
        "12.5 pcs bolt M12\n",
        "12,5 Stk Schraube M12\n",
        "qty;unit;item\n12.5;pcs;bolt M12\n",
    ],
)
def test_fractional_pieces_are_refused(data):
    name = "list.csv" if data.startswith("qty") else "items.txt"
    _, result = extract(name, data)
    assert result.positions == ()
    assert "must be whole" in result.warnings[0].message


@pytest.mark.parametrize("delimiter", ["\t", ";"])
def test_a_text_file_that_starts_with_a_csv_header_is_read_as_csv(delimiter):
    # Excel's "Text (tab delimited)" export, saved as .txt: each row was its Pos number of
    # pieces of the rest ("1 pcs of '12 Stk Träger'"), with a warning on the header only.
    rows = ["Pos", "Menge", "Einheit", "Bezeichnung"], ["1", "12", "Stk", "Träger"]
    text = "".join(delimiter.join(row) + "\r\n" for row in rows)
    _, result = extract("liste.txt", text.encode("utf-16"))
    assert [(p.label, p.quantity, p.unit, p.item) for p in result.positions] == [
        ("1", Decimal(12), Unit.PIECES, "Träger")
    ]
    assert result.warnings == ()


def test_a_comma_heading_above_text_lines_stays_text():
    _, result = extract("liste.txt", "Qty, Item\n12 pcs steel beam HEA 200, 6 m\n")
    assert [(p.quantity, p.item, p.length_mm) for p in result.positions] == [
        (Decimal(12), "steel beam HEA 200", 6000)
    ]


# Old Mac exports end lines in CR alone: such a file was decoded as one line, so its UTF-8
# line became mojibake ("TrÃ¤ger"), without a warning.
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_one_bad_byte_spoils_only_its_own_line(newline):
    first, second = "4 Stk Träger HEA 200, 6 m", "2 Stk Rohr f\xfcr Gel\xe4nder, 3 m"
    data = (first + newline).encode() + (second + newline).encode("cp1252")
    source, result = extract("items.txt", data)
    assert [p.item for p in result.positions] == ["Träger HEA 200", "Rohr für Geländer"]
    assert [(w.line_no, "not UTF-8" in w.message) for w in source.warnings] == [(2, True)]
    assert source.text.splitlines() == [first, second]


def test_a_windows_1252_file_needs_no_warning():
    source, result = extract("items.txt", "4 Stück Träger, 6 m\n".encode("cp1252"))
    assert [p.item for p in result.positions] == ["Träger"]
    assert source.warnings == ()


def test_warning_lines_count_the_lines_of_a_multi_line_quoted_field():
    text = (
        "position;qty;unit;item;length_mm\n"  # line 1
        '1;4;Stk;"Träger HEA 200\nfeuerverzinkt\nmit Kopfplatte";6000\n'  # lines 2-4
        "2;x;pcs;beam;\n"  # line 5
        "3;2;Stk;Rohr 60x4;3000\n"  # line 6
    )
    _, result = extract("list.csv", text)
    assert [p.line_no for p in result.positions] == [2, 6]
    assert [(w.line_no, w.message) for w in result.warnings] == [(5, "'x' is not a number")]


# --- shapes that once lost characters without a warning


@pytest.mark.parametrize("line", ["5, m Rohr", "5 , m Rohr", "12; Stk Träger", "12, Träger"])
def test_a_quantity_ending_in_a_separator_is_refused(line):
    _, result = extract("items.txt", f"{line}\n")
    assert result.positions == ()
    (warning,) = result.warnings
    assert "ends in a separator" in warning.message


@pytest.mark.parametrize(
    ("line", "quantity", "unit", "item", "length_mm"),
    [
        ("4 Stk Rohr, 6 lfm", "4", Unit.PIECES, "Rohr", 6000),
        ("4 Stk Rohr je 6 lfdm", "4", Unit.PIECES, "Rohr", 6000),
        ("4 Stk Rohr, 6 Meter", "4", Unit.PIECES, "Rohr", 6000),
        ("2 x 6 m Rohr 60x4", "2", Unit.PIECES, "Rohr 60x4", 6000),
        ("2 \u00d7 6000 mm Rohr", "2", Unit.PIECES, "Rohr", 6000),
        ("12x6m Rohr", "12", Unit.PIECES, "Rohr", 6000),
        ("12 X 6 M Rohr", "12", Unit.PIECES, "Rohr", 6000),
        ("12 Stk x 6 m Träger HEA 200", "12", Unit.PIECES, "Träger HEA 200", 6000),
        ("12 Stk à 2,5 m Träger", "12", Unit.PIECES, "Träger", 2500),
        ("12 x 40x5 Flachstahl", "12", Unit.PIECES, "40x5 Flachstahl", None),
        ("4 Stk Träger HEA 200, Einzellänge 6 m", "4", Unit.PIECES, "Träger HEA 200", 6000),
        ("4 Stk Träger, Einzellaenge: 6000 mm", "4", Unit.PIECES, "Träger", 6000),
        ("4 pcs beam, single length 6 m", "4", Unit.PIECES, "beam", 6000),
        # A total length is shared by the pieces.
        ("12 Stk Träger HEA 200, Gesamtlänge 72 m", "12", Unit.PIECES, "Träger HEA 200", 6000),
        ("12 pcs beam, total length 72 m", "12", Unit.PIECES, "beam", 6000),
        # In metres, a total length is the quantity itself.
        ("72 m Rohr, Gesamtlänge 72 m", "72", Unit.METRES, "Rohr", None),
        # A length in metres reads a lone separator before three digits as the decimal
        # one: 6,250 m is 6250 mm (as thousands it would be a 6 km piece).
        ("12 Stk Rohr, 6,250 m", "12", Unit.PIECES, "Rohr", 6250),
        ("12 Stk Rohr L=1.000 m", "12", Unit.PIECES, "Rohr", 1000),
    ],
)
def test_length_forms(line, quantity, unit, item, length_mm):
    _, result = extract("items.txt", f"{line}\n")
    (position,) = result.positions
    assert (position.quantity, position.unit, position.item, position.length_mm) == (
        Decimal(quantity),
        unit,
        item,
        length_mm,
    )
    assert result.warnings == ()


@pytest.mark.parametrize(
    ("line", "item", "message"),
    [
        ("4 Stk Träger L=6000", "Träger", "'L=6000' names no unit"),
        ("4 Stk Träger, Länge 6", "Träger", "'Länge 6' names no unit"),
        ("4 Stk Träger je 6", "Träger", "'je 6' names no unit"),
        ("7 Stk Träger, Gesamtlänge 10 m", "Träger", "rounded to 1429 mm"),
    ],
)
def test_a_length_form_that_leaves_a_choice_open_warns(line, item, message):
    _, result = extract("items.txt", f"{line}\n")
    (position,) = result.positions
    assert position.item == item
    (warning,) = result.warnings
    assert message in warning.message


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("70 m Rohr, Gesamtlänge 72 m", "the total length 72 m is not the quantity 70 m"),
        ("2 t Rohr, Gesamtlänge 72 m", "a total length needs a quantity in pieces or metres"),
        ("2 x 6 m Rohr, 6 m", "two piece lengths"),
        # Was 12 beams of 8 m, "Träger, 6m" the item, without a warning.
        ("12 Stk Träger, 6m, 8m", "two piece lengths"),
        ("12 Stk Träger, L=6 m; 8 lfm", "two piece lengths"),
        ("7 Stk Träger, Gesamtlänge 0,001 m", "out of range"),
    ],
)
def test_a_length_form_that_contradicts_the_line_is_refused(line, message):
    _, result = extract("items.txt", f"{line}\n")
    assert result.positions == ()
    (warning,) = result.warnings
    assert message in warning.message


def test_a_length_in_millimetres_before_the_piece_length_describes_the_item():
    fields = parse_item_line("4 Stk Rohr, 3 mm, 6 m")
    assert (fields["item"], fields["length_mm"]) == ("Rohr, 3 mm", 6000)


def test_an_ambiguous_length_in_millimetres_or_centimetres_still_warns():
    _, result = extract("items.txt", "4 Stk Rohr, 6,250 mm\n4 Stk Rohr, 1,250 cm\n")
    assert [p.length_mm for p in result.positions] == [6250, 12500]
    assert [
        "read as 6250" in w.message or "read as 1250" in w.message for w in result.warnings
    ] == [
        True,
        True,
    ]


def test_a_length_column_in_metres_reads_three_decimals_as_millimetres():
    _, result = extract("list.csv", "Menge;Einheit;Bezeichnung;Länge (m)\n4;Stk;Rohr;6,250\n")
    assert [p.length_mm for p in result.positions] == [6250]
    assert result.warnings == ()


@pytest.mark.parametrize("cell", ["6 lfm", "6 Meter", "6 metres", "6,000 m"])
def test_a_length_cell_takes_every_metre_spelling(cell):
    _, result = extract("list.csv", f"Menge;Einheit;Bezeichnung;Länge\n4;Stk;Rohr;{cell}\n")
    assert [p.length_mm for p in result.positions] == [6000]
    assert result.warnings == ()
