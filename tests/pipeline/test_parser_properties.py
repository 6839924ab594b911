"""Properties of the parsers (hypothesis): numbers survive formatting in every locale,
the extractor accounts for every character of a line (text, Markdown lists, CSV and
Markdown tables, every length form), and every pattern that sees user input runs in
linear time. Pure functions, no database."""

from __future__ import annotations

import re
import signal
import string
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pipeline import catalog as catalog_module
from pipeline import extract as extract_module
from pipeline.catalog import default_catalog
from pipeline.extract import (
    UNITS,
    LineExtractor,
    SourceFile,
    detect_material,
    inspect_upload,
    parse_item_line,
    read_number,
    sniff_format,
)
from pipeline.models import FileFormat

# --- formatting a quantity in each locale and reading it back

#: (thousands separator, decimal separator) of the ways inquiries write numbers.
LOCALES = {
    "de": (".", ","),
    "en": (",", "."),
    "de-plain": ("", ","),
    "en-plain": ("", "."),
    "ch": ("'", "."),
    "de-space": ("\u00a0", ","),
    "fr-narrow": ("\u202f", ","),
}


def format_number(value: Decimal, thousands: str, decimal: str) -> str:
    text = f"{value:f}"
    integer, _, fraction = text.partition(".")
    groups = []
    while len(integer) > 3 and thousands:
        groups.insert(0, integer[-3:])
        integer = integer[:-3]
    grouped = thousands.join([integer, *groups])
    return f"{grouped}{decimal}{fraction}" if fraction else grouped


quantities = st.decimals(
    min_value=Decimal("0.001"), max_value=Decimal("999999999"), places=3, allow_nan=False
).map(lambda d: d.normalize() if d == d.to_integral_value() else d)


@given(value=quantities, locale=st.sampled_from(sorted(LOCALES)), trim=st.booleans())
@example(value=Decimal("1.234"), locale="en-plain", trim=False)
@example(value=Decimal("1234.5"), locale="de", trim=False)
def test_a_quantity_formatted_in_any_locale_reads_back(value, locale, trim):
    if trim:
        value = value.normalize()
    value = Decimal(f"{value:f}")
    text = format_number(value, *LOCALES[locale])
    number = read_number(text)
    if number.note:
        # The one ambiguity: one to three digits, one separator, three digits. It is read
        # as thousands and always says so; the other reading is the decimal one.
        assert re.fullmatch(r"[1-9]\d{0,2}[.,]\d{3}", text)
        assert value in {number.value, Decimal(text.replace(",", "."))}
        assert number.value == Decimal(re.sub(r"[.,]", "", text))
    else:
        assert number.value == value


# --- the extractor accounts for every character


WORDS = ["Träger", "HEA", "200", "Flachstahl", "40x5", "steel", "beam", "Rohr", "60,3x2,9"]
WORDS += ["S355J2", "verzinkt", "Schraube", "M12", "Edelstahl", "1.4301", "flat", "bar"]
UNIT_SPELLINGS = sorted(UNITS)
#: Length forms at a line's end -> the piece length they name for 12 pieces (None: none;
#: "warn": left out with a warning).
LENGTHS = {
    ", 6 m": 6000,
    "; 6000 mm": 6000,
    " L=6000 mm": 6000,
    " length 6 m": 6000,
    " je 3 m": 3000,
    ", 2,5 m": 2500,
    ", 6 lfm": 6000,
    " je 6 lfdm": 6000,
    ", 6,250 m": 6250,
    ", Einzellänge 6 m": 6000,
    ", single length: 6000 mm": 6000,
    ", Gesamtlänge 72 m": 6000,
    ", total length 72000 mm": 6000,
    " L=6000": "warn",
    ", Länge 6": "warn",
    "": None,
}
#: Length forms right after the count ("{n} x 6 m item") -> the piece length.
LEADING_LENGTHS = {" x 6 m ": 6000, "x6m ": 6000, " \u00d7 2500 mm ": 2500, " Stk à 3 lfm ": 3000}
# What may stand outside the item in a line that became a position (checked after the
# item is cut out): the label, the quantity, its unit, a length, and punctuation that
# separates them from the item (", ", "; ", " - ").
_NUM = r"[\d.,'\u00a0\u202f]+"
_LUNIT = r"(?:mm|cm|meters?|metres?|lfdm|lfm|m)"
_WORDS = "|".join(
    map(re.escape, extract_module.PIECE_LENGTH_WORDS + extract_module.TOTAL_LENGTH_WORDS)
)
_PREFIX = re.compile(
    r"(?:pos(?:ition)?\.? ?\d+[a-z]? ?[:.)-]? )?"
    r"[\d.,'\u00a0\u202f ]+ ?(?:[x\u00d7]|\w+\.?)?"
    rf"(?: ?(?:(?:[x\u00d7]|je|à) ?)?{_NUM} ?{_LUNIT}\.?)?[ ,;-]*",
    re.IGNORECASE,
)
_SUFFIX = re.compile(
    rf"[ ,;-]*(?:(?: ?[,;] ?(?:{_WORDS})?| (?:{_WORDS}))(?: ?[=:])? ?"
    rf"{_NUM}(?: ?{_LUNIT}\.?)? ?)?",
    re.IGNORECASE,
)


@st.composite
def item_lines(draw) -> tuple[str, dict]:
    """A line as an inquiry writes it, and what it asks for."""
    value = draw(quantities)
    locale = draw(st.sampled_from(sorted(LOCALES)))
    unit = draw(st.sampled_from(["", *UNIT_SPELLINGS]))
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
    if not unit:
        # Without a unit, the item must not begin like one, nor like digit groups.
        words = ["Träger", *words]
    item = " ".join(words)
    number = format_number(value, *LOCALES[locale])
    if draw(st.booleans()):
        length = draw(st.sampled_from(sorted(LENGTHS)))
        line = f"{number} {unit} {item}{length}".replace("  ", " ")
        return line, {"item": item, "length": LENGTHS[length], "leading": False}
    # Pieces of a length, the length right after the count: "12 x 6 m Träger".
    leading = draw(st.sampled_from(sorted(LEADING_LENGTHS)))
    line = f"{number}{leading}Träger {item}".replace("  ", " ")
    return line, {"item": f"Träger {item}", "length": LEADING_LENGTHS[leading], "leading": True}


@settings(max_examples=200, deadline=None)
@given(line_and_expected=item_lines())
@example(
    line_and_expected=(
        "12 Stk Träger, Gesamtlänge 72 m",
        {"item": "Träger", "length": 6000, "leading": False},
    )
)
@example(
    line_and_expected=(
        "12x6m Träger Rohr",
        {"item": "Träger Rohr", "length": 6000, "leading": True},
    )
)
@example(
    line_and_expected=(
        "4 Stk Träger L=6000",
        {"item": "Träger", "length": "warn", "leading": False},
    )
)
def test_a_well_formed_line_keeps_its_whole_item(line_and_expected):
    line, expected = line_and_expected
    try:
        fields = parse_item_line(line)
    except extract_module.LineError as exc:
        # Refused with a reason: fractional pieces, a quantity out of range, a total
        # length that is not the quantity in metres or is given with kilograms.
        assert str(exc)
        return
    assert fields["item"] == expected["item"]
    want = expected["length"]
    if want == "warn":
        assert fields["length_mm"] is None
        assert any("names no unit" in note for note in fields["notes"])
    elif want is None:
        assert fields["length_mm"] is None
    elif expected["leading"] or fields["quantity"] == 12:
        # A total length is shared by the pieces: exact for 12 pieces.
        assert fields["length_mm"] == want
    else:
        assert fields["length_mm"] is not None or fields["unit"] == "m"


def _collapsed(line: str) -> str:
    return extract_module._collapse(line)


def account(line: str, item: str) -> None:
    """Everything outside ``item`` in ``line`` is syntax the position holds elsewhere."""
    text = _collapsed(line)
    # The item may also occur inside the syntax ("1 m m": the unit, then the item "m"):
    # one of its occurrences must leave nothing but syntax around it.
    starts = [i for i in range(len(text)) if text.startswith(item, i)]
    assert starts, f"item {item!r} is not a piece of {text!r}"
    splits = [(text[:start], text[start + len(item) :]) for start in starts]
    assert any(
        _PREFIX.fullmatch(prefix) and _SUFFIX.fullmatch(suffix) for prefix, suffix in splits
    ), f"around {item!r} in {text!r}, {splits} drop characters"


lines = st.lists(
    st.sampled_from(
        [
            *(string.ascii_letters + string.digits + " .,;:=-x'\t"),
            *("ä", "ü", "\u00d7", "\u00a0", "\u202f", " m", " mm", " Stk ", " pcs ", "Pos 1: "),
            *(" lfm", " x 6 m ", "x6m", " L=", " je ", ", Einzellänge ", ", Gesamtlänge "),
            *(" | ", "|"),
        ]
    ),
    max_size=30,
).map("".join)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(body=st.lists(lines, max_size=8), markdown=st.booleans())
@example(body=["12 pcs beam, 6 m", "1.234,5 m Flachstahl", "x"], markdown=False)
@example(
    body=["5, m Rohr", "4 Stk Träger L=6000", "12x6m Rohr", "2 x 6 m Rohr, 6 m"], markdown=False
)
@example(body=["4 Stk Träger, Einzellänge 6 m", "12 Stk Rohr, 6,250 m"], markdown=True)
def test_every_line_ends_in_a_position_or_a_warning(body, markdown):
    text = "\n".join(f"- {line}" if markdown else line for line in body)
    fmt = FileFormat.MARKDOWN if markdown else FileFormat.TEXT
    result = LineExtractor().extract(
        SourceFile(file_id=None, filename="f.txt", format=fmt, text=text)
    )
    accounted = {p.line_no for p in result.positions} | {w.line_no for w in result.warnings}
    all_lines = text.splitlines()
    for index in range(len(all_lines)):
        if extract_module._is_table_start(all_lines, index):
            # A table's header holds its column names (or is warned about), the next line
            # only the delimiter row's dashes.
            accounted |= {index + 1, index + 2}
    for line_no, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if markdown:
            stripped = stripped.removeprefix("-").strip()
        if not stripped or stripped.startswith(("#", "//")):
            continue
        if markdown and not extract_module._LIST_MARKER.match(line):
            continue  # prose
        assert line_no in accounted, f"line {line_no} {line!r} vanished"
    warned = {w.line_no for w in result.warnings}
    for position in result.positions:
        if position.line_no in warned:
            continue  # what the item leaves out, the line's warning names
        body_line = text.splitlines()[position.line_no - 1]
        marker = extract_module._LIST_MARKER.match(body_line)
        account(body_line[marker.end() :] if marker else body_line, position.item)


# --- tables: CSV (semicolon, comma, tab) and Markdown, headers in any case

#: Header names per field, as inquiries spell them.
HEADER_NAMES = {
    "label": ["Pos", "Position", "Nr", "pos."],
    "qty": ["Menge", "qty", "Quantity", "Anzahl"],
    "unit": ["Einheit", "unit", "ME"],
    "item": ["Bezeichnung", "item", "Description", "Artikel"],
    "length": ["Länge (m)", "length_mm", "Länge [mm]", "length in metres"],
}
TABLE_FORMS = ["csv;", "csv,", "csv\t", "markdown", "text-markdown"]


def _recase(draw, name: str) -> str:
    return draw(st.sampled_from([name, name.upper(), name.lower(), name.title()]))


@st.composite
def tables(draw) -> tuple[str, str, list[dict]]:
    """A table in one of ``TABLE_FORMS``, header names in any case, and its rows."""
    form = draw(st.sampled_from(TABLE_FORMS))
    fields = [
        "qty",
        "item",
        *draw(st.lists(st.sampled_from(["label", "unit", "length"]), unique=True)),
    ]
    fields = draw(st.permutations(fields))
    header = [_recase(draw, draw(st.sampled_from(HEADER_NAMES[f]))) for f in fields]
    rows = []
    for index in range(draw(st.integers(min_value=1, max_value=4))):
        value = Decimal(draw(st.integers(min_value=1, max_value=999_999_999)))
        locale = draw(st.sampled_from(sorted(LOCALES)))
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=4))
        length = (
            draw(st.sampled_from(["", "6", "6 m", "6000 mm", "2,5"])) if "length" in fields else ""
        )
        rows.append(
            {
                "label": str(index + 1),
                "qty": format_number(value, *LOCALES[locale]),
                "unit": draw(st.sampled_from(["Stk", "pcs", "STK", "Stück", ""])),
                "item": " ".join(words),
                "length": length,
                "value": value,
            }
        )
    if form.startswith("csv"):
        delimiter = form[3:]

        def cell(text: str) -> str:
            return f'"{text}"' if delimiter in text or '"' in text else text

        lines = [delimiter.join(cell(h) for h in header)]
        lines += [delimiter.join(cell(row[f]) for f in fields) for row in rows]
        return "list.csv", "\n".join(lines) + "\n", rows
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row[f] for f in fields) + " |" for row in rows]
    name = "anfrage.md" if form == "markdown" else "anfrage.txt"
    return name, "Bitte um Angebot:\n\n" + "\n".join(lines) + "\n", rows


@settings(max_examples=150, deadline=None)
@given(table=tables())
def test_every_table_row_ends_in_a_position_or_a_warning(table):
    name, text, rows = table
    result = LineExtractor().extract(inspect_upload(name, text.encode()))
    first_row = len(text.splitlines()) - len(rows) + 1
    by_line = {p.line_no: p for p in result.positions}
    warned = {w.line_no for w in result.warnings}
    for offset, row in enumerate(rows):
        line_no = first_row + offset
        assert line_no in by_line or line_no in warned, f"row {row} vanished"
        position = by_line.get(line_no)
        if position is None:
            continue
        # The whole item, the quantity as written (up to an ambiguity it warns about).
        assert position.item == row["item"]
        assert position.quantity == row["value"] or line_no in warned
        if not row["length"]:
            assert position.length_mm is None
        else:
            assert position.length_mm is not None or line_no in warned


# --- linear time on adversarial lines

#: A line of 100,000 of one character: a quadratic pattern needs hours on it (the old
#: length pattern took 6.4 s for 10,000 spaces), a linear one milliseconds.
LINE_CHARS = 100_000
#: Generous: a linear pass over one such line takes well under a tenth of this even on a
#: loaded machine; a quadratic one cannot finish in it.
PER_LINE_SECONDS = 5.0
#: One of each kind the patterns treat apart: blanks, digits, separators, list markers,
#: unit and keyword letters, quotes, and non-ASCII letters and spaces.
ADVERSARIAL = list(" \t\u00a0\u202f\u2009\u202801.,;:'=-+*#/amxlLSeä\u00d7•\"(|\\")


class TooSlow(Exception):
    pass


@contextmanager
def bounded(seconds: float, what: str) -> Iterator[None]:
    """Raise ``TooSlow`` when the block runs longer than ``seconds`` (a wall-clock alarm,
    so a quadratic pattern fails the test instead of hanging it)."""

    def alarm(signum, frame):
        raise TooSlow(f"{what} took longer than {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def user_input_patterns() -> list[tuple[str, re.Pattern[str]]]:
    """Every compiled pattern of the extractor and the catalog: each sees user input."""
    found = []
    for module in (extract_module, catalog_module):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                found.append((f"{module.__name__}.{name}", value))
            elif isinstance(value, tuple) and all(
                isinstance(v, tuple) and len(v) == 2 and isinstance(v[1], re.Pattern) for v in value
            ):
                found.extend((f"{module.__name__}.{name}[{v[0]}]", v[1]) for v in value)
    catalog = default_catalog()
    for entry in catalog.items:
        for keyword in entry.keywords:
            found.append((f"keyword {keyword!r}", catalog_module._keyword_pattern(keyword)))
    return found


def test_the_pattern_list_covers_the_extractor():
    names = {name for name, _ in user_input_patterns()}
    assert {"pipeline.extract._LENGTH", "pipeline.extract._QUANTITY"} <= names
    assert "pipeline.extract._FAMILIES[steel]" in names


def _entry_points() -> list[tuple[str, Callable[[str], object]]]:
    def swallow(func: Callable[[str], object]) -> Callable[[str], object]:
        def run(line: str) -> object:
            try:
                return func(line)
            except (extract_module.LineError, ValueError):
                return None

        return run

    def extract_as(fmt: FileFormat) -> Callable[[str], object]:
        return lambda line: LineExtractor().extract(
            SourceFile(file_id=None, filename="f", format=fmt, text=line)
        )

    return [
        ("parse_item_line", swallow(parse_item_line)),
        ("read_number", swallow(read_number)),
        ("detect_material", detect_material),
        ("sniff_format", sniff_format),
        ("catalog match", default_catalog().match),
        ("extract text", extract_as(FileFormat.TEXT)),
        ("extract markdown", extract_as(FileFormat.MARKDOWN)),
        ("extract csv", extract_as(FileFormat.CSV)),
        (
            "extract csv after a header",
            lambda line: extract_as(FileFormat.CSV)("qty;unit;item;length\n" + line),
        ),
        ("a line with a quantity first", swallow(lambda line: parse_item_line("12 pcs " + line))),
        (
            "extract a Markdown table row",
            lambda line: extract_as(FileFormat.MARKDOWN)("| qty | item |\n|---|---|\n" + line),
        ),
        (
            "extract a Markdown table's delimiter row",
            lambda line: extract_as(FileFormat.TEXT)("| qty | item |\n" + line),
        ),
    ]


@pytest.mark.parametrize("char", ADVERSARIAL, ids=lambda c: f"U+{ord(c):04X}")
def test_every_pattern_is_linear_on_a_line_of_one_character(char):
    line = char * LINE_CHARS
    for name, pattern in user_input_patterns():
        with bounded(PER_LINE_SECONDS, f"{name}.search on {LINE_CHARS} x {char!r}"):
            pattern.search(line)
            pattern.match(line)
    for name, run in _entry_points():
        with bounded(PER_LINE_SECONDS, f"{name} on {LINE_CHARS} x {char!r}"):
            run(line)


@settings(max_examples=10, deadline=None)
@example(unit=", 1", prefix="12 pcs beam")
@example(unit="0,", prefix="")
@example(unit="1 ", prefix="Pos 1: 4 Stk Träger")
@given(
    unit=st.text(alphabet=" ,;.0123456789mLl=x\t\u00a0", min_size=1, max_size=4),
    prefix=st.sampled_from(["", "12 pcs beam", "Pos 1: 4 Stk Träger", "- "]),
)
def test_repeated_short_units_stay_linear(unit, prefix):
    """Adversarial lines of a repeated few characters (", 1" over and over) as well."""
    line = prefix + unit * (LINE_CHARS // len(unit))
    for name, run in _entry_points():
        with bounded(PER_LINE_SECONDS, f"{name} on {unit!r} x {LINE_CHARS // len(unit)}"):
            run(line)
