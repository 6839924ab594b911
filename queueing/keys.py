"""Singleton keys: one builder per key format, every part validated.

A key such as ``extract:acme:42`` names one unit of work. Keys are built only by a
:class:`KeyFormat`, so two call sites can never disagree on the format (a typo such as
``analysis-queue`` would silently split a lock or a dedup key in two).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from queueing.exceptions import InvalidKey

__all__ = ["KeyFormat", "validate_key"]

SEPARATOR = ":"
MAX_PART_LENGTH = 64
#: Parts are restricted to a safe alphabet: no ``:`` (the separator) and no ``/`` (used by
#: ``enqueue`` to mark the exclusive policy), no whitespace.
_PART = re.compile(r"^[A-Za-z0-9_.@+-]+$")


def validate_part(name: str, value: object) -> str:
    text = str(value)
    if not text:
        raise InvalidKey(f"key part {name!r} is empty")
    if len(text) > MAX_PART_LENGTH:
        raise InvalidKey(
            f"key part {name!r} is {len(text)} characters long; the limit is {MAX_PART_LENGTH}"
        )
    if not _PART.match(text):
        raise InvalidKey(
            f"key part {name!r}={text!r} may only hold letters, digits and '_.@+-' "
            f"(no {SEPARATOR!r}, '/' or spaces)"
        )
    return text


@dataclass(frozen=True, kw_only=True)
class KeyFormat:
    """A declared key format, e.g. ``KeyFormat(parts=("stage", "tenant", "anfrage"))``.

    ``prefix`` (optional) is a constant first part, e.g. ``"sweep"`` for ``sweep:<name>``.
    """

    parts: tuple[str, ...]
    prefix: str | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise InvalidKey("a key format needs at least one part")
        if self.prefix is not None:
            validate_part("prefix", self.prefix)

    def build(self, **values: object) -> str:
        """Return the key for ``values`` (exactly the declared parts, each validated)."""
        missing = [p for p in self.parts if p not in values]
        extra = sorted(set(values) - set(self.parts))
        if missing or extra:
            raise InvalidKey(f"key format {self.parts} got missing={missing} unexpected={extra}")
        texts = [validate_part(p, values[p]) for p in self.parts]
        if self.prefix is not None:
            texts.insert(0, self.prefix)
        return SEPARATOR.join(texts)

    def leading(self, **values: object) -> str:
        """The key of this format up to its last part (separator included), for SQL that
        appends the last part itself (an id column) to look keys up in bulk."""
        expected = self.parts[:-1]
        if set(values) != set(expected):
            raise InvalidKey(f"key format {self.parts} needs exactly the leading parts {expected}")
        texts = [validate_part(p, values[p]) for p in expected]
        if self.prefix is not None:
            texts.insert(0, self.prefix)
        return "".join(f"{text}{SEPARATOR}" for text in texts)

    def parse(self, key: str) -> dict[str, str]:
        """Split a key built by this format back into its parts."""
        texts = key.split(SEPARATOR)
        if self.prefix is not None:
            if not texts or texts[0] != self.prefix:
                raise InvalidKey(f"{key!r} does not start with {self.prefix!r}")
            texts = texts[1:]
        if len(texts) != len(self.parts):
            raise InvalidKey(f"{key!r} does not have the parts {self.parts}")
        return dict(zip(self.parts, texts, strict=True))


def validate_key(key: str) -> str:
    """Check a whole key (as passed to ``enqueue``): each ``:``-separated part is valid."""
    if not isinstance(key, str) or not key:
        raise InvalidKey("a singleton key must be a non-empty string")
    for index, part in enumerate(key.split(SEPARATOR)):
        validate_part(f"#{index}", part)
    return key
