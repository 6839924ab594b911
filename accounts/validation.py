"""Checks for text about to be stored, shared by the API schemas, the services and the
management commands, so every entry point refuses the same input with the same words.

PostgreSQL's ``text`` and ``jsonb`` cannot hold NUL (U+0000), and UTF-8 cannot encode a
lone surrogate (U+D800 to U+DFFF: what a malformed ``\\ud800`` JSON escape or undecodable
command-line bytes become in Python). Either reaches the database driver as an error, so
both are refused here, naming the field.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
from collections.abc import Callable

from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from django.utils.text import slugify

from accounts.models import ApiToken, Tenant, User

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

USERNAME_MAX = User._meta.get_field("username").max_length
TENANT_SLUG_MAX = Tenant._meta.get_field("slug").max_length
TOKEN_NAME_MAX = ApiToken._meta.get_field("name").max_length


class InvalidText(ValueError):
    """A text value cannot be stored as given; the message names the field and why."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


def unstorable_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` (None when it can)."""
    match = _UNSTORABLE.search(value)
    if match is None:
        return None
    char = match.group()
    kind = "a NUL character" if char == "\x00" else "a lone surrogate"
    return (
        f"contains {kind} (U+{ord(char):04X}) at position {match.start()}, which cannot be "
        "stored; remove it"
    )


def storable_text(value: str, *, field: str, max_length: int | None = None) -> str:
    """``value`` unchanged, or :class:`InvalidText` naming ``field`` when it holds a
    character PostgreSQL cannot store or is longer than ``max_length``."""
    problem = unstorable_problem(value)
    if problem is not None:
        raise InvalidText(field, problem)
    if max_length is not None and len(value) > max_length:
        raise InvalidText(field, f"has {len(value)} characters; at most {max_length}")
    return value


def valid_username(value: str, *, field: str = "username") -> str:
    """A username as Django's own forms accept it: letters, digits and ``@.+-_``, at most
    150 characters (so no control characters, spaces or NUL)."""
    storable_text(value, field=field, max_length=USERNAME_MAX)
    if not value:
        raise InvalidText(field, "must not be empty")
    try:
        UnicodeUsernameValidator()(value)
    except ValidationError:
        raise InvalidText(
            field, "may contain only letters, digits and the characters @ . + - _"
        ) from None
    return value


def valid_tenant_slug(value: str, *, field: str = "tenant") -> str:
    """A tenant slug: lowercase letters, digits and ``-``, at most 64 characters."""
    storable_text(value, field=field, max_length=TENANT_SLUG_MAX)
    if not value or slugify(value) != value:
        raise InvalidText(field, f"{value!r} is not a slug: use lowercase, digits and '-'")
    return value


def valid_token_name(value: str, *, field: str = "name") -> str:
    """A token's label: any storable text of at most 100 characters."""
    return storable_text(value, field=field, max_length=TOKEN_NAME_MAX)


# Argument types for management commands: argparse turns an ArgumentTypeError into a
# usage error (a CommandError under call_command), never a traceback.

#: Largest id PostgreSQL's bigint holds.
MAX_ID = 2**63 - 1


def text_argument(*, max_length: int) -> Callable[[str], str]:
    """An argparse type: storable text of at most ``max_length`` characters."""

    def parse(value: str) -> str:
        problem = unstorable_problem(value)
        if problem is None and len(value) > max_length:
            problem = f"has {len(value)} characters; at most {max_length}"
        if problem is not None:
            raise argparse.ArgumentTypeError(problem)
        return value

    return parse


def int_argument(*, minimum: int = 1, maximum: int = MAX_ID) -> Callable[[str], int]:
    """An argparse type: a whole number from ``minimum`` to ``maximum``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if not minimum <= number <= maximum:
            raise argparse.ArgumentTypeError(f"must be from {minimum} to {maximum}, got {number}")
        return number

    return parse


def read_bounded(path: str, *, max_bytes: int) -> bytes:
    """The content of the regular file at ``path``, read with a bound: at most
    ``max_bytes`` + 1 bytes are ever read, so a device (``/dev/zero``, whose ``stat()``
    size is 0), a file that grows while it is read or a FIFO never fills memory or
    blocks. ``ValueError`` (the reason) for anything else; ``OSError`` as ``open`` raises it."""
    # O_NONBLOCK: opening a FIFO does not wait for a writer (no effect on a regular file).
    with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise ValueError(f"{path} is not a regular file")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{path} has more than {max_bytes} bytes; at most {max_bytes} per file")
    return data
