"""Reading requested items out of uploaded files.

:func:`inspect_upload` decides whether bytes are a file the pipeline can read at all
(not empty, not binary, a known format) and decodes them. An :class:`Extractor` turns one
decoded file into positions and one warning per line it could not read. The default,
:class:`LineExtractor`, is deterministic and offline; another can be plugged in with the
``PIPELINE_EXTRACTOR`` setting (a dotted path to a class with the same ``extract``).

Formats (German and English units: pcs/Stk/Stück, m/lfm, mm, cm, kg, t):

* text: one item per line, ``12 pcs steel beam HEA 200, 6 m``; ``#`` starts a comment;
* CSV: a header row ``position;qty;unit;item;material;length_mm`` (German names such as
  ``menge``/``einheit``/``bezeichnung`` too; ``;``, ``,`` or tab separated); a text file
  whose first line is such a header is read as CSV;
* Markdown: list items (``-``, ``*``, ``+``, ``1.``) in the text format; other lines are
  prose and ignored;
* in text and Markdown, a Markdown table (a header row, a delimiter row ``|---|---|``,
  its rows) is read as a CSV whose delimiter is the pipe.

Column names, units and keywords match in any case. A piece length is read at a line's
end (``, 6 m``, ``L=6000 mm``, ``Einzellänge 6 m``; ``Gesamtlänge 72 m`` is shared by the
pieces) or right after the count (``2 x 6 m Rohr``, ``12x6m Rohr``). UTF-16 files are
decoded (:func:`utf16_codec`).

Numbers are read in their German or English form, decided per number (:func:`read_number`);
what a line leaves open (an ambiguous number, a length column without a unit, a rounded
length) keeps the position and adds a warning on its line. The patterns that search a
line run on whitespace-collapsed text, each in time linear in the line (docs/pipeline.md
has the rules).
"""

from __future__ import annotations

import codecs
import csv
import io
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from functools import cache, partial
from pathlib import PurePath
from typing import Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from pipeline.exceptions import BinaryFile, EmptyFile, UnknownFormat
from pipeline.models import FileFormat, Unit

DEFAULT_EXTRACTOR = "pipeline.extract.LineExtractor"

EXTENSIONS = {
    ".txt": FileFormat.TEXT,
    ".text": FileFormat.TEXT,
    ".csv": FileFormat.CSV,
    ".md": FileFormat.MARKDOWN,
    ".markdown": FileFormat.MARKDOWN,
}

#: Unit spellings -> (canonical unit, factor to it).
UNITS: dict[str, tuple[Unit, Decimal]] = {
    **dict.fromkeys(
        ["pcs", "pc", "piece", "pieces", "ea", "x", "stk", "stck", "stück", "stueck", "st"],
        (Unit.PIECES, Decimal(1)),
    ),
    **dict.fromkeys(
        ["m", "meter", "meters", "metre", "metres", "lfm", "lfdm"], (Unit.METRES, Decimal(1))
    ),
    "cm": (Unit.METRES, Decimal("0.01")),
    "mm": (Unit.METRES, Decimal("0.001")),
    **dict.fromkeys(["kg", "kilo", "kilogramm", "kilogram"], (Unit.KILOGRAMS, Decimal(1))),
    **dict.fromkeys(["t", "to", "tonne", "tonnen", "tons"], (Unit.KILOGRAMS, Decimal(1000))),
}
#: Units of what the catalog does not sell by (area, volume, imperial, grams): after a
#: quantity they refuse the line rather than become part of the item, which would make
#: "12 m² Blech" twelve pieces (matched lower case).
FOREIGN_UNITS = frozenset(
    {"m²", "m2", "qm", "sqm", "m³", "m3", "cbm", "l", "ltr", "liter", "litre", "g"}
    | {"ft", "feet", "foot", "inch", "inches", "zoll", "yd", "yard", "yards", "lb", "lbs"}
)
#: Right after a quantity's digits: inches ("10\"") and feet ("20'").
_INCHES_OR_FEET = {'"': "inches", "\u2033": "inches", "'": "feet", "\u2032": "feet"}
LENGTH_UNITS = {"mm": Decimal(1), "cm": Decimal(10), "m": Decimal(1000)}
#: Length unit spellings -> the length unit (matched lower case).
LENGTH_UNIT_NAMES = {
    "mm": "mm",
    "cm": "cm",
    **dict.fromkeys(["m", "lfm", "lfdm", "meter", "meters", "metre", "metres"], "m"),
}
MAX_QUANTITY = Decimal("999999999")
MAX_LENGTH_MM = 1_000_000
MAX_ITEM_CHARS = 300
#: How far from a line's end its piece length may begin (", L = 1.000.000,5 mm").
LENGTH_WINDOW = 40

# --- numbers: German (1.234,5) and English (1,234.5) forms, decided per number

#: Characters that only ever group thousands (apostrophe, no-break and narrow no-break space).
GROUP_ONLY = "'\u2019\u00a0\u202f"
_SEPARATORS = ".," + GROUP_ONLY
#: A number token: digits, single separators between digit runs. Linear: each repetition
#: starts with a separator, so there is one way to match.
_NUMBER = rf"\d+(?:[{_SEPARATORS}]\d+)*"
_NUMBER_TOKEN = re.compile(_NUMBER)
_GROUP_ONLY = re.compile(f"[{GROUP_ONLY}]")
_GROUPED_DECIMAL = re.compile(r"(?P<integer>[\d']+)(?:[.,](?P<fraction>\d+))?")


_LABEL = re.compile(r"^pos(?:ition)?\.? ?(?P<label>\d+[a-z]?) ?[:.)-]? ", re.IGNORECASE)
_LIST_MARKER = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
# Run on whitespace-collapsed text (:func:`_collapse`), so every space below is one
# character and no pattern can rescan a run of blanks: each is linear in the line.
_QUANTITY = re.compile(
    rf"^(?P<qty>{_NUMBER})(?P<groups>(?: \d{{3}}(?=\s|$))*(?: \d{{3}}[.,]\d+(?=\s|$))?) ?"
    r"(?:(?P<times>[x\u00d7])(?=\s)|(?P<unit>[^\W\d_]\w*)\.?(?=\s|$))? ?(?P<rest>.*)$"
)
#: Right after a quantity's number: a range ("2-3", an en dash too, "2 bis 3", "2 to 3"), a
#: fraction ("1/2") or a vulgar fraction glued to it ("2½"; "12 ½\" Rohr" is an item's).
_RANGE_OR_FRACTION = re.compile(
    r"(?: ?[-/\u2013\u2014] ?| (?:bis|to) )\d|[\u00bc-\u00be\u2150-\u215e]", re.IGNORECASE
)
#: A number and a unit of pieces or weight after a line's quantity, maybe after ``x`` or
#: ``+``: a second quantity ("1 12 Stk Träger", "3 x 12 Stk", "12+2 Stk"); a length may
#: describe the item ("12 10 mm Blech"). (No match starts inside a number and a unit is
#: short: a search stays linear.)
_COUNTED = re.compile(
    rf"(?:[x\u00d7+] ?)?(?<![\d{_SEPARATORS}]){_NUMBER} ?(?P<unit>[^\W\d_]\w{{0,15}})\.?(?=\s|$)",
    re.IGNORECASE,
)
_COUNTED_UNITS = frozenset(
    word for word, (unit, _) in UNITS.items() if unit != Unit.METRES and word != "x"
)
#: A cell's quantity grouped by plain spaces: "12 000", "12 345,5".
_SPACE_GROUPED = re.compile(r"\d{1,3}(?: \d{3})+(?:[.,]\d+)?")
_LENGTH_UNIT = r"(?:mm|cm|meters?|metres?|lfdm|lfm|m)"
#: The words that name the length of one piece, and of all pieces together (lower case).
PIECE_LENGTH_WORDS = (
    "l",
    "length",
    "länge",
    "laenge",
    "je",
    "à",
    "einzellänge",
    "einzellaenge",
    "stücklänge",
    "stuecklaenge",
    "single length",
)
TOTAL_LENGTH_WORDS = ("gesamtlänge", "gesamtlaenge", "total length")
_LENGTH_WORD = "|".join(
    sorted((re.escape(w) for w in PIECE_LENGTH_WORDS + TOTAL_LENGTH_WORDS), key=len, reverse=True)
)
# A length at the end: ", 6 m", "; 6000 mm", " L=6000 mm", " length 6 m", " je 6 lfm",
# ", Einzellänge 6 m", ", Gesamtlänge 72 m"; after a keyword also without a unit
# ("L=6000": a length left out with a warning).
_LENGTH = re.compile(
    rf"(?: ?[,;] ?(?P<word>{_LENGTH_WORD})?| (?P<spaced>{_LENGTH_WORD}))(?: ?[=:])? ?"
    rf"(?P<len>{_NUMBER})(?: ?(?P<lunit>{_LENGTH_UNIT})\.?)? ?$",
    re.IGNORECASE,
)
#: A piece length right after the count: "2 x 6 m Rohr", "12x6m Rohr", "12 Stk à 6 m".
#: (No match starts inside a number: a search over a run of digits stays linear.)
_LEADING_LENGTH = re.compile(
    rf"(?P<times>(?:[x\u00d7]|je|à) ?)?(?<![\d{_SEPARATORS}])(?P<len>{_NUMBER}) ?"
    rf"(?P<lunit>{_LENGTH_UNIT})\.?(?= |$) ?",
    re.IGNORECASE,
)
#: Invisible characters pasted from web pages: a zero-width space is a space; a soft
#: hyphen, zero-width (non-)joiners, a word joiner and a BOM are nothing.
_INVISIBLE = str.maketrans({"\u200b": " ", **dict.fromkeys("\u00ad\u200c\u200d\u2060\ufeff", None)})
#: Whitespace runs, collapsed to one space; a lone no-break or narrow no-break space
#: between two digits stays (it groups them), elsewhere it is a space ("12\u00a0m").
_BLANKS = re.compile(r"(?P<grouping>(?<=\d)[\u00a0\u202f](?=\d))|\s+")
#: A length column's header with its unit: "length_mm", "Länge (m)", "Länge [mm]",
#: "Länge in m", "Länge/mm", "Länge (Meter)", "length in metres" (matched lower case).
_LENGTH_HEADER = re.compile(
    r"(?:length|länge|laenge)(?:[ _/]?(?:in )?[(\[]?(?P<unit>mm|cm|m|"
    r"(?P<prefix>milli|centi|zenti)?met(?:er|re)s?)[)\]]?)?"
)
#: The length units a header may spell out, by their prefix.
_HEADER_UNIT_PREFIXES = {None: "m", "milli": "mm", "centi": "cm", "zenti": "cm"}
#: A length cell: a number and, maybe, its unit.
_LENGTH_CELL = re.compile(rf"(?P<len>{_NUMBER}) ?(?P<unit>{_LENGTH_UNIT})?\.?", re.IGNORECASE)
# Material: a grade code first, then a family word (German compounds: "Stahlträger").
_GRADES = re.compile(
    r"\b(S\d{3}(?:J[R02](?:\+N)?|N|M)?|St\s?(?:37|52)|1\.4\d{3}|AlMg\d|EN\s?AW-\d{4})\b",
    re.IGNORECASE,
)
_FAMILIES = (
    ("stainless", re.compile(r"edelstahl|stainless|inox|\bv[24]a\b", re.IGNORECASE)),
    ("aluminium", re.compile(r"alumin(?:i)?um|\balu", re.IGNORECASE)),
    ("steel", re.compile(r"stahl|steel", re.IGNORECASE)),
)

CSV_COLUMNS = {
    "label": ("position", "pos", "pos.", "nr", "no"),
    "qty": ("qty", "quantity", "menge", "anzahl"),
    "unit": ("unit", "einheit", "me"),
    "item": ("item", "description", "bezeichnung", "artikel", "beschreibung"),
    "material": ("material", "werkstoff"),
}
CSV_HEADER_HINT = "position;qty;unit;item;material;length_mm"


@dataclass(frozen=True, kw_only=True)
class SourceFile:
    """A decoded file handed to an extractor (``file_id`` is None before intake)."""

    file_id: int | None
    filename: str
    format: FileFormat
    text: str
    #: What decoding had to decide (a line in another encoding, a replaced byte).
    warnings: tuple[LineWarning, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ParsedPosition:
    file_id: int | None
    line_no: int
    raw: str
    quantity: Decimal
    unit: Unit
    item: str
    material: str = ""
    length_mm: int | None = None
    label: str = ""


@dataclass(frozen=True, kw_only=True)
class LineWarning:
    file_id: int | None
    line_no: int
    line: str
    message: str


@dataclass(frozen=True, kw_only=True)
class Extraction:
    positions: tuple[ParsedPosition, ...]
    warnings: tuple[LineWarning, ...]


class Extractor(Protocol):
    def extract(self, source: SourceFile) -> Extraction: ...


class LineError(ValueError):
    """A line is not a requested item (the message says why)."""


@dataclass(frozen=True)
class Number:
    """A number as read, and the note to show when the reading was a choice (then
    ``decimal`` is the other reading: the lone separator as the decimal one)."""

    value: Decimal
    note: str = ""
    decimal: Decimal | None = None


def read_number(text: str) -> Number:
    """``12``, ``2,5``, ``2.5``, ``1.234,5``, ``1,234.5``, ``1'234`` or ``1 234`` (a
    no-break space) as a Decimal.

    The decimal separator is decided per number: with both ``.`` and ``,``, the last one;
    a separator that occurs twice or more groups thousands; a lone ``.`` or ``,``
    followed by exactly three digits, after one to three digits that do not start with 0
    (``1.200``, ``1,000``), groups thousands too, and the number carries a note that it
    may have been meant as a decimal. Any other lone separator is the decimal one.
    Thousands groups must be of three digits, else ``LineError``.
    """
    shown = text.strip()
    if not _NUMBER_TOKEN.fullmatch(shown):
        raise LineError(f"{shown!r} is not a number")
    token = _GROUP_ONLY.sub("'", shown)
    if "'" in token:
        parts = _GROUPED_DECIMAL.fullmatch(token)
        if parts is None:
            raise LineError(f"{shown!r} is not a number (a separator after the decimals)")
        fraction = parts.group("fraction")
        integer = _ungrouped(parts.group("integer"), "'", shown)
        return Number(value=Decimal(integer + (f".{fraction}" if fraction else "")))
    dots, commas = token.count("."), token.count(",")
    if dots and commas:
        decimal_sep = "." if token.rfind(".") > token.rfind(",") else ","
        integer, _, fraction = token.rpartition(decimal_sep)
        if decimal_sep in integer:
            raise LineError(f"{shown!r} is not a number (two decimal separators)")
        thousands = "," if decimal_sep == "." else "."
        return Number(value=Decimal(f"{_ungrouped(integer, thousands, shown)}.{fraction}"))
    if dots + commas > 1:
        return Number(value=Decimal(_ungrouped(token, "." if dots else ",", shown)))
    if dots + commas == 0:
        return Number(value=Decimal(token))
    sep = "." if dots else ","
    integer, _, fraction = token.partition(sep)
    if len(fraction) == 3 and len(integer) <= 3 and not integer.startswith("0"):
        other = "," if sep == "." else "."
        return Number(
            value=Decimal(integer + fraction),
            decimal=Decimal(f"{integer}.{fraction}"),
            note=(
                f"{shown!r} is read as {integer}{fraction} ({sep!r} separating thousands); "
                f"write {integer}{fraction}, or {integer}{other}{fraction.rstrip('0') or '0'} "
                "for a decimal"
            ),
        )
    return Number(value=Decimal(f"{integer}.{fraction}"))


def _ungrouped(integer: str, separator: str, shown: str) -> str:
    """The digits of ``integer``, grouped in threes by ``separator``, or ``LineError``."""
    groups = integer.split(separator)
    if not 1 <= len(groups[0]) <= 3 or any(len(g) != 3 for g in groups[1:]):
        raise LineError(f"{shown!r} is not a number (thousands are groups of three digits)")
    return "".join(groups)


def get_extractor() -> Extractor:
    """The configured extractor (``settings.PIPELINE_EXTRACTOR``, default line-based)."""
    return _load_extractor(getattr(settings, "PIPELINE_EXTRACTOR", "") or DEFAULT_EXTRACTOR)


@cache
def _load_extractor(path: str) -> Extractor:
    return import_string(path)()


def format_by_name(filename: str) -> FileFormat | None:
    """The format the extension names; None without an extension; ``UnknownFormat`` for
    any other extension."""
    suffix = PurePath(filename).suffix.lower()
    if not suffix:
        return None
    try:
        return EXTENSIONS[suffix]
    except KeyError:
        known = ", ".join(sorted(EXTENSIONS))
        raise UnknownFormat(
            f"file {filename!r}: unknown format {suffix!r}; send one of {known}"
        ) from None


def sniff_format(text: str) -> FileFormat:
    """The format of a file without an extension, from its content."""
    lines = text.splitlines()
    header_no, delimiter = _csv_header(lines)
    if header_no is not None and _csv_layout(lines[header_no], delimiter) is not None:
        return FileFormat.CSV
    if any(_LIST_MARKER.match(line) for line in text.splitlines()):
        return FileFormat.MARKDOWN
    return FileFormat.TEXT


#: How much of a file's start decides whether it is UTF-16 without a BOM.
UTF16_SNIFF_BYTES = 4096


def utf16_codec(head: bytes) -> str | None:
    """The UTF-16 codec a file's first bytes show, or None: ``utf-16`` after a BOM;
    without one ``utf-16-le`` (``utf-16-be``) when NUL bytes stand only at odd (even)
    offsets of the first ``UTF16_SNIFF_BYTES`` and in at least every other character —
    text in Latin script, as inquiries are, has a NUL high byte in most characters."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    sample = head[: min(len(head), UTF16_SNIFF_BYTES) // 2 * 2]
    even, odd = sample[0::2].count(0), sample[1::2].count(0)
    chars = len(sample) // 2
    if odd and not even and 2 * odd >= chars:
        return "utf-16-le"
    if even and not odd and 2 * even >= chars:
        return "utf-16-be"
    return None


def decode(filename: str, data: bytes) -> tuple[str, tuple[tuple[int, str], ...]]:
    """Bytes as text, and ``(line_no, note)`` for each line that needed a fallback;
    refuses empty and binary content.

    UTF-16 (with a BOM, or without one by its NUL bytes: :func:`utf16_codec`) is read as
    UTF-16. A file that is UTF-8 throughout is read as UTF-8. Otherwise each line is:
    UTF-8 where it is, else Windows-1252 — so one stray byte spoils no other line. A
    Windows-1252 line in a file whose other lines hold UTF-8 is noted (the file mixes
    encodings), and so is a byte neither encoding defines (replaced by U+FFFD)."""
    utf16 = utf16_codec(data)
    if utf16 is not None:
        try:
            text, notes = data.decode(utf16).removeprefix("\ufeff"), ()
        except UnicodeDecodeError as exc:
            raise BinaryFile(
                f"file {filename!r} is neither text nor valid UTF-16 ({exc.reason}); "
                "send plain text, CSV or Markdown"
            ) from None
    elif b"\x00" in data:
        raise BinaryFile(f"file {filename!r} is binary; send plain text, CSV or Markdown")
    else:
        try:
            text, notes = data.decode("utf-8-sig"), ()
        except UnicodeDecodeError:
            text, notes = _decode_lines(data.removeprefix(codecs.BOM_UTF8))
    if not text.strip():
        raise EmptyFile(f"file {filename!r} is empty")
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f")
    if controls > max(2, len(text) // 100):
        raise BinaryFile(f"file {filename!r} is binary; send plain text, CSV or Markdown")
    return text, notes


def _decode_lines(data: bytes) -> tuple[str, tuple[tuple[int, str], ...]]:
    lines: list[str] = []
    fallback: list[int] = []
    notes: list[tuple[int, str]] = []
    utf8_seen = False
    line_no = 1
    # Lines end in LF, CRLF or CR alone (old Mac exports), each kept as it was.
    for raw in data.splitlines(keepends=True):
        try:
            line = raw.decode("utf-8")
            utf8_seen = utf8_seen or not raw.isascii()
        except UnicodeDecodeError:
            line = raw.decode("cp1252", errors="replace")
            fallback.append(line_no)
            if "\ufffd" in line:
                notes.append(
                    (
                        line_no,
                        "a byte that is neither UTF-8 nor Windows-1252 was replaced by '\ufffd'",
                    )
                )
        lines.append(line)
        # Line numbers count as str.splitlines does (the extractors' lines).
        line_no += max(1, len(line.splitlines()))
    if utf8_seen:
        notes.extend(
            (n, "this line is not UTF-8 like the rest of the file; read as Windows-1252")
            for n in fallback
        )
    return "".join(lines), tuple(sorted(notes))


def inspect_upload(filename: str, data: bytes) -> SourceFile:
    """Decode an upload and decide its format, or raise the ``InvalidUpload`` that names
    the problem. Pure: no I/O."""
    return read_source(file_id=None, filename=filename, data=data, format=None)


def read_source(
    *, file_id: int | None, filename: str, data: bytes, format: FileFormat | None
) -> SourceFile:
    """The decoded file with the decoding's notes as warnings; ``format`` None: decided
    by the extension, else sniffed from the content."""
    by_name = format or format_by_name(filename)
    text, notes = decode(filename, data)
    lines = text.splitlines()
    return SourceFile(
        file_id=file_id,
        filename=filename,
        format=by_name or sniff_format(text),
        text=text,
        warnings=tuple(
            LineWarning(
                file_id=file_id,
                line_no=line_no,
                line=lines[line_no - 1][:1000] if line_no <= len(lines) else "",
                message=message,
            )
            for line_no, message in notes
        ),
    )


def parse_unit(text: str) -> tuple[Unit, Decimal]:
    key = text.strip().lower().rstrip(".")
    if not key:
        return Unit.PIECES, Decimal(1)
    try:
        return UNITS[key]
    except KeyError:
        raise LineError(f"unknown unit {text.strip()!r}") from None


def read_length(value: str, unit: str, notes: list[str]) -> Decimal:
    """A length in millimetres, as written (not rounded). In metres, a lone separator
    before three digits is the decimal one (``6,250 m`` is 6250 mm: as thousands it would
    be a kilometre or more); in mm and cm it groups thousands, with a note."""
    unit = LENGTH_UNIT_NAMES[unit.lower()]
    number = read_number(value)
    if number.decimal is not None and unit == "m":
        number = Number(value=number.decimal)
    if number.note:
        notes.append(f"length: {number.note}")
    return number.value * LENGTH_UNITS[unit]


def whole_millimetres(length: Decimal, shown: str, notes: list[str]) -> int:
    """``length`` (mm) rounded half up to whole millimetres, with a note when it was
    rounded; ``LineError`` when it is not between 1 mm and ``MAX_LENGTH_MM``."""
    whole = int(length.to_integral_value(rounding=ROUND_HALF_UP))
    if whole < 1 or length > MAX_LENGTH_MM:
        raise LineError(f"length {shown} is out of range")
    if whole != length:
        notes.append(f"length {shown} rounded to {whole} mm")
    return whole


def parse_length(value: str, unit: str, notes: list[str]) -> int:
    """A length in whole millimetres; a note in ``notes`` when it was rounded or its
    number was ambiguous."""
    return whole_millimetres(read_length(value, unit, notes), f"{value} {unit}", notes)


def detect_material(item: str) -> str:
    """A grade code (``S355J2``, ``1.4301``) if the text names one, else a family word
    (``stainless``, ``aluminium``, ``steel``), else empty."""
    grade = _GRADES.search(item)
    if grade:
        return re.sub(r"\s+", "", grade.group(1)).upper()
    for family, pattern in _FAMILIES:
        if pattern.search(item):
            return family
    return ""


def _checked_quantity(text: str, unit: Unit, factor: Decimal, notes: list[str]) -> Decimal:
    number = read_number(text)
    if number.note:
        notes.append(f"quantity: {number.note}")
    quantity = number.value * factor
    if quantity <= 0:
        raise LineError("the quantity must be positive")
    if quantity > MAX_QUANTITY:
        raise LineError("the quantity is too large")
    if unit == Unit.PIECES and quantity != quantity.to_integral_value():
        raise LineError(f"{text.strip()} pieces: a number of pieces must be whole")
    kept = quantity.quantize(Decimal("0.001"))
    if kept == 0:
        raise LineError(
            f"the quantity must be positive ({quantity} {unit} rounds to 0; "
            "quantities are kept to 0.001)"
        )
    return kept


def _space_grouped(qty: str, notes: list[str]) -> str:
    """``12 000`` (digit groups after plain spaces) as one number, with a note."""
    grouped = qty.replace(" ", "'")
    notes.append(
        f"quantity: {qty!r} is read as one number, "
        f"{read_number(grouped).value}; write it without spaces to confirm"
    )
    return grouped


def _checked_item(item: str, notes: list[str]) -> str:
    if not item:
        raise LineError("the line names no item")
    if len(item) > MAX_ITEM_CHARS:
        notes.append(f"the item text was cut to {MAX_ITEM_CHARS} characters")
    return item[:MAX_ITEM_CHARS]


def _collapse(text: str) -> str:
    """``text`` stripped, invisible characters dropped (:data:`_INVISIBLE`), each run of
    whitespace one space (a lone no-break space between digits stays: it groups them).
    Every pattern that reads a line runs on this."""
    visible = text.translate(_INVISIBLE)
    return _BLANKS.sub(lambda m: m.group() if m.group("grouping") else " ", visible).strip()


def _trailing_length(
    length: re.Match[str], shown: str, quantity: Decimal, unit: Unit, notes: list[str]
) -> int | None:
    """The piece length a line's end names: a length of one piece as written; a total
    length shared by the pieces (in metres it must be the quantity, and adds nothing);
    none, with a note, when the number names no unit."""
    lunit = length.group("lunit")
    if lunit is None:
        notes.append(
            f"the length {shown!r} names no unit: left out; write it with its unit, "
            f"e.g. '{shown} mm'"
        )
        return None
    word = (length.group("word") or length.group("spaced") or "").lower()
    if word not in TOTAL_LENGTH_WORDS:
        return parse_length(length.group("len"), lunit, notes)
    total = read_length(length.group("len"), lunit, notes)
    written = f"{length.group('len')} {lunit}"
    if unit == Unit.METRES:
        if total != quantity * 1000:
            raise LineError(
                f"the total length {written} is not the quantity {quantity.normalize():f} m; "
                "write one"
            )
        return None
    if unit != Unit.PIECES:
        raise LineError(f"a total length needs a quantity in pieces or metres, not {unit}")
    return whole_millimetres(
        total / quantity, f"{written} / {quantity.normalize():f} pieces", notes
    )


def parse_item_line(line: str) -> dict:
    """``[Pos 3:] 12 pcs steel beam HEA 200, 6 m`` -> the fields of a position, and in
    ``notes`` what the line leaves open (an ambiguous number, a rounded length)."""
    text = _collapse(line)
    notes: list[str] = []
    label = ""
    labelled = _LABEL.match(text)
    if labelled:
        label = labelled.group("label")
        text = text[labelled.end() :]
    match = _QUANTITY.match(text)
    if not match:
        raise LineError("expected a quantity first, e.g. '12 pcs steel beam HEA 200, 6 m'")
    rest = match.group("rest")
    unit_word = match.group("unit") or ""
    times = bool(match.group("times")) or unit_word.lower() == "x"
    ranged = _RANGE_OR_FRACTION.match(text, match.end("groups"))
    if ranged:
        shown = text[: ranged.end()]
        raise LineError(f"{shown!r} reads as a range or a fraction of quantities; write one")
    if not unit_word and not times and rest[:1] in (",", ";"):
        # "5, m Rohr": the decimals are missing, or the separator is a typo.
        shown = text[: match.start("rest") + 1]
        raise LineError(
            f"{shown!r} ends in a separator; write the number whole ('5 m') "
            "or with its decimals ('5,5 m')"
        )
    imperial = _INCHES_OR_FEET.get(text[match.end("groups") : match.end("groups") + 1])
    if imperial:
        raise LineError(
            f"{text[: match.end('groups') + 1]!r} reads as {imperial}; write the quantity "
            "in pieces, metres or kilograms (pcs, m, kg)"
        )
    if unit_word.lower().rstrip(".") in FOREIGN_UNITS:
        raise LineError(
            f"unit {unit_word!r} is not one an inquiry is priced in; write pieces, metres "
            "or kilograms (pcs, m, kg)"
        )
    if unit_word and unit_word.lower().rstrip(".") not in UNITS:
        # "12 steel beams": the word is part of the item, the unit defaults to pieces.
        rest = text[match.start("unit") :]
        unit_word = ""
    counted = None if unit_word and not times else _COUNTED.match(rest)
    if counted and counted.group("unit").lower() in _COUNTED_UNITS:
        shown = text[: match.start("rest")] + counted.group()
        raise LineError(
            f"{shown!r} holds two numbers before the item; write one quantity, and a "
            "position number as 'Pos 1: 12 Stk …'"
        )
    qty = match.group("qty")
    if match.group("groups"):
        qty = _space_grouped(qty + match.group("groups"), notes)
    unit, factor = parse_unit(unit_word)
    quantity = _checked_quantity(qty, unit, factor, notes)
    length_mm = None
    leading = _LEADING_LENGTH.match(rest) if unit == Unit.PIECES else None
    if leading and (times or leading.group("times")):
        # "2 x 6 m Rohr", "12x6m Rohr", "12 Stk à 6 m Träger": pieces of a length.
        length_mm = parse_length(leading.group("len"), leading.group("lunit"), notes)
        rest = rest[leading.end() :]
    # A length is short: looking for it in the line's last characters only keeps the
    # search linear whatever the line holds (a number token may span a whole line).
    length = _LENGTH.search(rest, max(0, len(rest) - LENGTH_WINDOW))
    if length and (length.group("lunit") or length.group("word") or length.group("spaced")):
        shown = length.group().lstrip(" ,;")
        if length_mm is not None:
            raise LineError(f"the line names two piece lengths (the second: {shown!r}); write one")
        length_mm = _trailing_length(length, shown, quantity, unit, notes)
        rest = rest[: length.start()]
        # "Träger, 6 m, 8 m": a second length in metres before it. (One in mm or cm may
        # describe the item: "Rohr, 3 mm, 6 m".)
        earlier = _LENGTH.search(rest, max(0, len(rest) - LENGTH_WINDOW))
        if earlier and LENGTH_UNIT_NAMES.get((earlier.group("lunit") or "").lower()) == "m":
            raise LineError(
                f"the line names two piece lengths ({earlier.group().lstrip(' ,;')!r} and "
                f"{shown!r}); write one"
            )
    item = _checked_item(rest.strip(" ,;-"), notes)
    return {
        "label": label,
        "quantity": quantity,
        "unit": unit,
        "item": item,
        "material": detect_material(item),
        "length_mm": length_mm,
        "notes": notes,
    }


# --- CSV


@dataclass(frozen=True, kw_only=True)
class CsvLayout:
    """A CSV header: the delimiter, each field's column and the length column's unit
    (from its name: ``length_mm``, ``Länge (m)``, ``Länge in cm``; None when it names
    none)."""

    delimiter: str
    columns: dict[str, int]
    length_unit: str | None
    #: How many cells the header has.
    width: int


def _delimiter(header: str) -> str:
    return ";" if ";" in header else "\t" if "\t" in header else ","


#: Excel's first line when asked to name the delimiter: ``sep=;``.
_EXCEL_SEPARATOR = re.compile(r"sep=(?P<delimiter>[;,\t|])", re.IGNORECASE)


def _csv_header(lines: Sequence[str]) -> tuple[int | None, str | None]:
    """The index of a CSV's header row — its first non-empty line, or the one after
    Excel's ``sep=;`` — and the delimiter that line named (None: the header decides)."""
    filled = (index for index, line in enumerate(lines) if line.strip())
    first = next(filled, None)
    named = None if first is None else _EXCEL_SEPARATOR.fullmatch(lines[first].strip(" \r\n"))
    if named is None:
        return first, None
    return next(filled, None), named.group("delimiter")


def _csv_layout(header_line: str, delimiter: str | None = None) -> CsvLayout | None:
    """The layout a header row names, or None unless it names at least qty and item.
    Cells may be quoted (``"Position";"Menge"``)."""
    delimiter = delimiter or _delimiter(header_line)
    return _layout(next(csv.reader([header_line], delimiter=delimiter), []), delimiter)


def _layout(cells: Sequence[str], delimiter: str) -> CsvLayout | None:
    """The layout header ``cells`` name (in any case), or None unless they name at least
    qty and item."""
    header = [_collapse(cell).lower() for cell in cells]
    columns: dict[str, int] = {}
    length_unit = None
    for field, names in CSV_COLUMNS.items():
        for index, cell in enumerate(header):
            if cell in names:
                columns[field] = index
                break
    for index, cell in enumerate(header):
        named = _LENGTH_HEADER.fullmatch(cell)
        if "length" not in columns and named:
            columns["length"] = index
            length_unit = named.group("unit")
            if length_unit and length_unit not in LENGTH_UNITS:
                length_unit = _HEADER_UNIT_PREFIXES[named.group("prefix")]
    if not {"qty", "item"} <= columns.keys():
        return None
    return CsvLayout(
        delimiter=delimiter, columns=columns, length_unit=length_unit, width=len(header)
    )


def _is_spreadsheet_text(text: str) -> bool:
    """Whether a text file is a spreadsheet saved as text (Excel's "Text (tab delimited)"
    and "Unicode Text"; a ``;`` list): its first line a CSV header separated by tabs or
    ``;``. Read as text, each row would be its Pos number of pieces of the rest; a heading
    "Qty, Item" above text lines stays text."""
    lines = text.splitlines()
    header_no, delimiter = _csv_header(lines)
    if header_no is None:
        return False
    layout = _csv_layout(lines[header_no], delimiter)
    return layout is not None and layout.delimiter in ("\t", ";")


# --- Markdown tables: a header row, a delimiter row ("|---|:--:|"), rows; read as CSV

#: A table's delimiter row (matched on the stripped line): cells of dashes, each maybe
#: with colons (alignment), between pipes. Each repetition starts with a pipe: linear.
_TABLE_DELIMITER_ROW = re.compile(r"\|? ?:?-+:? ?(?:\| ?:?-+:? ?)*\|?")
#: A cell boundary: a pipe not escaped by a backslash ("Blech \| 2 mm" is one cell).
_TABLE_PIPE = re.compile(r"(?<!\\)\|")
TABLE_HEADER_HINT = "| Pos | Menge | Einheit | Bezeichnung |"


def table_cells(line: str) -> list[str]:
    """The cells of a Markdown table row (outer pipes optional, ``\\|`` a pipe in a
    cell)."""
    row = line.strip()
    row = row.removeprefix("|")
    if row.endswith("|") and not row.endswith("\\|"):
        row = row[:-1]
    return [cell.replace("\\|", "|") for cell in _TABLE_PIPE.split(row)]


def _is_table_start(lines: Sequence[str], index: int) -> bool:
    """Whether ``lines[index]`` is a table's header: it holds a pipe and the next line is
    a delimiter row of as many cells."""
    if "|" not in lines[index] or index + 1 >= len(lines):
        return False
    delimiter = _collapse(lines[index + 1])
    return (
        "|" in delimiter
        and _TABLE_DELIMITER_ROW.fullmatch(delimiter) is not None
        and len(table_cells(delimiter)) == len(table_cells(lines[index]))
    )


class LineExtractor:
    """The default extractor: deterministic and offline, one position per readable line
    (or table row)."""

    def extract(self, source: SourceFile) -> Extraction:
        if source.format == FileFormat.CSV or (
            source.format == FileFormat.TEXT and _is_spreadsheet_text(source.text)
        ):
            return self._extract_csv(source)
        positions: list[ParsedPosition] = []
        warnings: list[LineWarning] = []
        lines = source.text.splitlines()
        table: CsvLayout | None = None
        in_table = False
        skip_to = 0
        for index, line in enumerate(lines):
            line_no = index + 1
            stripped = line.strip()
            if index < skip_to:
                continue
            if in_table and "|" in stripped:
                self._add_table_row(source, line_no, stripped, table, positions, warnings)
                continue
            in_table = False
            if _is_table_start(lines, index):
                in_table, skip_to = True, index + 2
                table = _layout(table_cells(line), "|")
                if table is None:
                    message = (
                        "this table's header names no qty and item column (such as "
                        f"{TABLE_HEADER_HINT!r}): its rows are not read"
                    )
                    warnings.append(_warning(source, line_no, stripped, message))
                continue
            if not stripped or stripped.startswith(("#", "//")):
                continue
            marker = _LIST_MARKER.match(line)
            if source.format == FileFormat.MARKDOWN and not marker:
                continue
            body = line[marker.end() :] if marker else line
            self._add(
                source, line_no, stripped, partial(parse_item_line, body), positions, warnings
            )
        return Extraction(positions=tuple(positions), warnings=tuple(warnings))

    def _add_table_row(
        self,
        source: SourceFile,
        line_no: int,
        row: str,
        layout: CsvLayout | None,
        positions: list[ParsedPosition],
        warnings: list[LineWarning],
    ) -> None:
        cells = table_cells(row)
        if not any(cell.strip() for cell in cells):
            return
        if layout is None:
            message = "this table's header names no qty and item column: the row is not read"
            warnings.append(_warning(source, line_no, row, message))
            return
        self._add(
            source, line_no, row, partial(self._csv_fields, cells, layout), positions, warnings
        )

    @staticmethod
    def _add(
        source: SourceFile,
        line_no: int,
        raw: str,
        parse: Callable[[], dict],
        positions: list[ParsedPosition],
        warnings: list[LineWarning],
    ) -> None:
        """The line's position and its notes as warnings, or its error as one warning."""
        try:
            fields = parse()
        except LineError as exc:
            warnings.append(_warning(source, line_no, raw, str(exc)))
            return
        notes = fields.pop("notes")
        positions.append(ParsedPosition(file_id=source.file_id, line_no=line_no, raw=raw, **fields))
        warnings.extend(_warning(source, line_no, raw, note) for note in notes)

    def _extract_csv(self, source: SourceFile) -> Extraction:
        lines = source.text.splitlines()
        header_no, delimiter = _csv_header(lines)
        if header_no is None:
            return Extraction(positions=(), warnings=())
        header_line = lines[header_no]
        layout = _csv_layout(header_line, delimiter)
        if layout is None:
            message = f"the first row must be a header such as {CSV_HEADER_HINT!r}"
            warning = _warning(source, header_no + 1, header_line, message)
            return Extraction(positions=(), warnings=(warning,))
        positions: list[ParsedPosition] = []
        warnings: list[LineWarning] = []
        reader = csv.reader(
            io.StringIO("\n".join(lines[header_no + 1 :])), delimiter=layout.delimiter
        )
        consumed = 0
        for cells in reader:
            # A quoted field may span lines: a row starts on the line after the last one
            # the reader consumed.
            line_no = header_no + 2 + consumed
            consumed = reader.line_num
            if not any(cell.strip() for cell in cells):
                continue
            raw = layout.delimiter.join(cells)
            self._add(
                source,
                line_no,
                raw,
                partial(self._csv_fields, cells, layout),
                positions,
                warnings,
            )
        return Extraction(positions=tuple(positions), warnings=tuple(warnings))

    @staticmethod
    def _csv_fields(cells: Sequence[str], layout: CsvLayout) -> dict:
        columns = layout.columns
        if len(cells) <= max(columns.values()):
            raise LineError(f"expected {max(columns.values()) + 1} columns, got {len(cells)}")

        def cell(field: str) -> str:
            return _collapse(cells[columns[field]]) if field in columns else ""

        notes: list[str] = []
        past = [c for c in cells[layout.width :] if c.strip()]
        if past:
            # An unquoted delimiter in a cell shifts the rest of the row out of its columns.
            notes.append(
                f"the row has {len(cells)} cells, its header {layout.width}: "
                f"{layout.delimiter.join(past)[:100]!r} is not read; quote a cell that holds "
                "the delimiter"
            )
        unit, factor = parse_unit(cell("unit"))
        item = _checked_item(cell("item"), notes)
        length_mm = _csv_length(cell("length"), layout, notes) if cell("length") else None
        qty = cell("qty")
        if not qty:
            raise LineError("the qty column is empty")
        if _SPACE_GROUPED.fullmatch(qty):
            qty = _space_grouped(qty, notes)
        return {
            "label": cell("label")[:32],
            "quantity": _checked_quantity(qty, unit, factor, notes),
            "unit": unit,
            "item": item,
            "material": cell("material")[:64] or detect_material(item),
            "length_mm": length_mm,
            "notes": notes,
        }


def _csv_length(text: str, layout: CsvLayout, notes: list[str]) -> int | None:
    """A length cell: the unit written in it (``6 m``, ``2000 mm``), else the column's
    (``length_mm``, ``Länge (m)``); a bare number under a header without one is left out,
    with a note, rather than guessed."""
    match = _LENGTH_CELL.fullmatch(text)
    if match is None:
        raise LineError(f"length {text!r} is not a length such as '6 m' or '6000 mm'")
    unit = match.group("unit") or layout.length_unit
    if unit is None:
        notes.append(
            f"length {text!r} has no unit and its column names none: left out; "
            "write '6 m' or '6000 mm', or name the column 'length_mm' or 'Länge (m)'"
        )
        return None
    return parse_length(match.group("len"), unit, notes)


def _warning(source: SourceFile, line_no: int, line: str, message: str) -> LineWarning:
    return LineWarning(file_id=source.file_id, line_no=line_no, line=line[:1000], message=message)
