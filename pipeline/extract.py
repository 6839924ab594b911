"""Reading requested items out of uploaded files.

:func:`inspect_upload` decides whether bytes are a file the pipeline can read at all
(not empty, not binary, a known format) and decodes them. An :class:`Extractor` turns one
decoded file into positions and one warning per line it could not read. The default,
:class:`LineExtractor`, is deterministic and offline; another can be plugged in with the
``PIPELINE_EXTRACTOR`` setting (a dotted path to a class with the same ``extract``).

Formats (German and English units: pcs/Stk/Stück, m/lfm, mm, cm, kg, t):

* text: one item per line, ``12 pcs steel beam HEA 200, 6 m``; ``#`` starts a comment;
* CSV: a header row ``position;qty;unit;item;material;length_mm`` (German names such as
  ``menge``/``einheit``/``bezeichnung`` too; ``;``, ``,`` or tab separated);
* Markdown: list items (``-``, ``*``, ``+``, ``1.``) in the text format; other lines are
  prose and ignored.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from functools import cache
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
LENGTH_UNITS = {"mm": Decimal(1), "cm": Decimal(10), "m": Decimal(1000)}
MAX_QUANTITY = Decimal("999999999")
MAX_LENGTH_MM = 1_000_000

_NUMBER = r"\d+(?:[.,]\d+)?"
_LABEL = re.compile(r"^pos(?:ition)?\.?\s*(?P<label>\d+[a-z]?)\s*[:.)-]?\s+", re.IGNORECASE)
_LIST_MARKER = re.compile(r"^\s*(?:[-*+•]|\d+[.)])\s+")
_QUANTITY = re.compile(
    rf"^(?P<qty>{_NUMBER})\s*(?:[x\u00d7](?=\s)|(?P<unit>[^\W\d_]\w*)\.?(?=\s|$))?\s*(?P<rest>.*)$"
)
# The piece length at the end: ", 6 m", "; 6000 mm", " L=6000 mm", " length 6 m", " je 6 m".
_LENGTH = re.compile(
    rf"(?:\s*[,;]\s+(?:(?:l|length|länge|laenge|je|à)\s*[=:]?\s*)?"
    rf"|\s+(?:l|length|länge|laenge|je|à)\s*[=:]?\s*)"
    rf"(?P<len>{_NUMBER})\s*(?P<lunit>mm|cm|m)\.?\s*$",
    re.IGNORECASE,
)
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
    "length_mm": ("length_mm", "länge_mm", "laenge_mm", "length", "länge", "laenge"),
}
CSV_HEADER_HINT = "position;qty;unit;item;material;length_mm"


@dataclass(frozen=True, kw_only=True)
class SourceFile:
    """A decoded file handed to an extractor (``file_id`` is None before intake)."""

    file_id: int | None
    filename: str
    format: FileFormat
    text: str


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
    first = next((line for line in text.splitlines() if line.strip()), "")
    if _csv_columns(_split_header(first)) is not None:
        return FileFormat.CSV
    if any(_LIST_MARKER.match(line) for line in text.splitlines()):
        return FileFormat.MARKDOWN
    return FileFormat.TEXT


def decode(filename: str, data: bytes) -> str:
    """Bytes as text (UTF-8, else Windows-1252); refuses empty and binary content."""
    if not data.strip():
        raise EmptyFile(f"file {filename!r} is empty")
    if b"\x00" in data:
        raise BinaryFile(f"file {filename!r} is binary; send plain text, CSV or Markdown")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        try:
            text = data.decode("cp1252")
        except UnicodeDecodeError:
            raise BinaryFile(f"file {filename!r} is neither UTF-8 nor Windows-1252 text") from None
    controls = sum(1 for ch in text if ord(ch) < 32 and ch not in "\t\n\r\f")
    if controls > max(2, len(text) // 100):
        raise BinaryFile(f"file {filename!r} is binary; send plain text, CSV or Markdown")
    return text


def inspect_upload(filename: str, data: bytes) -> SourceFile:
    """Decode an upload and decide its format, or raise the ``InvalidUpload`` that names
    the problem. Pure: no I/O."""
    by_name = format_by_name(filename)
    text = decode(filename, data)
    return SourceFile(
        file_id=None, filename=filename, format=by_name or sniff_format(text), text=text
    )


def parse_number(text: str) -> Decimal:
    """``12``, ``2,5`` or ``2.5`` as a Decimal (German decimal comma accepted)."""
    try:
        value = Decimal(text.strip().replace(",", "."))
    except InvalidOperation:
        raise LineError(f"{text!r} is not a number") from None
    if not value.is_finite():
        raise LineError(f"{text!r} is not a number")
    return value


def parse_unit(text: str) -> tuple[Unit, Decimal]:
    key = text.strip().lower().rstrip(".")
    if not key:
        return Unit.PIECES, Decimal(1)
    try:
        return UNITS[key]
    except KeyError:
        raise LineError(f"unknown unit {text.strip()!r}") from None


def parse_length(value: str, unit: str) -> int:
    length = parse_number(value) * LENGTH_UNITS[unit.lower()]
    if length <= 0 or length > MAX_LENGTH_MM:
        raise LineError(f"length {value} {unit} is out of range")
    return int(length.to_integral_value())


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


def _checked_quantity(quantity: Decimal, factor: Decimal) -> Decimal:
    quantity = quantity * factor
    if quantity <= 0:
        raise LineError("the quantity must be positive")
    if quantity > MAX_QUANTITY:
        raise LineError("the quantity is too large")
    return quantity.quantize(Decimal("0.001"))


def parse_item_line(line: str) -> dict:
    """``[Pos 3:] 12 pcs steel beam HEA 200, 6 m`` -> the fields of a position."""
    text = line.strip()
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
    if unit_word and unit_word.lower().rstrip(".") not in UNITS:
        # "12 steel beams": the word is part of the item, the unit defaults to pieces.
        rest = text[match.start("unit") :]
        unit_word = ""
    unit, factor = parse_unit(unit_word)
    quantity = _checked_quantity(parse_number(match.group("qty")), factor)
    length_mm = None
    length = _LENGTH.search(rest)
    if length:
        length_mm = parse_length(length.group("len"), length.group("lunit"))
        rest = rest[: length.start()]
    item = rest.strip(" ,;-")
    if not item:
        raise LineError("the line names no item")
    return {
        "label": label,
        "quantity": quantity,
        "unit": unit,
        "item": item[:300],
        "material": detect_material(item),
        "length_mm": length_mm,
    }


def _delimiter(header: str) -> str:
    return ";" if ";" in header else "\t" if "\t" in header else ","


def _split_header(line: str) -> list[str]:
    return [cell.strip().lower() for cell in line.split(_delimiter(line))]


def _csv_columns(header: Sequence[str]) -> dict[str, int] | None:
    """Column positions by field, or None unless the header names at least qty and item."""
    columns = {}
    for field, names in CSV_COLUMNS.items():
        for index, cell in enumerate(header):
            if cell in names:
                columns[field] = index
                break
    return columns if {"qty", "item"} <= columns.keys() else None


class LineExtractor:
    """The default extractor: deterministic and offline, one position per readable line."""

    def extract(self, source: SourceFile) -> Extraction:
        if source.format == FileFormat.CSV:
            return self._extract_csv(source)
        positions: list[ParsedPosition] = []
        warnings: list[LineWarning] = []
        for line_no, line in enumerate(source.text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith(("#", "//")):
                continue
            marker = _LIST_MARKER.match(line)
            if source.format == FileFormat.MARKDOWN and not marker:
                continue
            body = line[marker.end() :] if marker else line
            try:
                fields = parse_item_line(body)
            except LineError as exc:
                warnings.append(_warning(source, line_no, line, str(exc)))
                continue
            positions.append(
                ParsedPosition(file_id=source.file_id, line_no=line_no, raw=stripped, **fields)
            )
        return Extraction(positions=tuple(positions), warnings=tuple(warnings))

    def _extract_csv(self, source: SourceFile) -> Extraction:
        lines = source.text.splitlines()
        header_no = next((i for i, line in enumerate(lines) if line.strip()), None)
        if header_no is None:
            return Extraction(positions=(), warnings=())
        header_line = lines[header_no]
        columns = _csv_columns(_split_header(header_line))
        if columns is None:
            message = f"the first row must be a header such as {CSV_HEADER_HINT!r}"
            warning = _warning(source, header_no + 1, header_line, message)
            return Extraction(positions=(), warnings=(warning,))
        delimiter = _delimiter(header_line)
        positions: list[ParsedPosition] = []
        warnings: list[LineWarning] = []
        reader = csv.reader(io.StringIO("\n".join(lines[header_no + 1 :])), delimiter=delimiter)
        for offset, cells in enumerate(reader):
            line_no = header_no + 2 + offset
            raw = delimiter.join(cells)
            if not any(cell.strip() for cell in cells):
                continue
            try:
                fields = self._csv_fields(cells, columns)
            except LineError as exc:
                warnings.append(_warning(source, line_no, raw, str(exc)))
                continue
            positions.append(
                ParsedPosition(file_id=source.file_id, line_no=line_no, raw=raw, **fields)
            )
        return Extraction(positions=tuple(positions), warnings=tuple(warnings))

    @staticmethod
    def _csv_fields(cells: Sequence[str], columns: dict[str, int]) -> dict:
        if len(cells) <= max(columns.values()):
            raise LineError(f"expected {max(columns.values()) + 1} columns, got {len(cells)}")

        def cell(field: str) -> str:
            return cells[columns[field]].strip() if field in columns else ""

        unit, factor = parse_unit(cell("unit"))
        item = cell("item")
        if not item:
            raise LineError("the item column is empty")
        length_mm = None
        if cell("length_mm"):
            length_mm = parse_length(cell("length_mm"), "mm")
        if not cell("qty"):
            raise LineError("the qty column is empty")
        return {
            "label": cell("label")[:32],
            "quantity": _checked_quantity(parse_number(cell("qty")), factor),
            "unit": unit,
            "item": item[:300],
            "material": cell("material")[:64] or detect_material(item),
            "length_mm": length_mm,
        }


def _warning(source: SourceFile, line_no: int, line: str, message: str) -> LineWarning:
    return LineWarning(file_id=source.file_id, line_no=line_no, line=line[:1000], message=message)
