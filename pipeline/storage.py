"""Content-addressed file storage under ``settings.STORAGE_ROOT``.

Two areas, both written with write-to-temp-then-rename (or link), so a reader never sees
half a file and writing the same bytes again is a no-op:

* ``staging/<sha[:2]>/<sha>``: the bytes of an upload, written at submit time *before* the
  inquiry's row commits (so the intake job can always find them). Keyed by content only.
  An upload through the API arrives in ``incoming/`` first (streamed, hashed as it
  arrives) and is linked into staging; its temporary file goes with its request.
* ``files/<storage_key>``: the stored file, copied there by intake and verified against
  its SHA-256. The storage key names tenant, inquiry and content
  (``<tenant>/<anfrage>/<sha256>``), so a retried intake writes the same path again.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from pipeline.exceptions import StorageCorrupt


@dataclass(frozen=True, kw_only=True)
class StagedFile:
    """A complete upload on disk (synced): its name as sent, its bytes' SHA-256 and size."""

    filename: str
    path: Path
    sha256: str
    size: int


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def storage_key(*, tenant_slug: str, anfrage_id: int, sha256: str) -> str:
    """The one builder of storage keys: ``<tenant>/<anfrage>/<sha256>``."""
    return f"{tenant_slug}/{anfrage_id}/{sha256}"


def _root() -> Path:
    return Path(settings.STORAGE_ROOT)


def incoming_dir() -> Path:
    """Where uploads stream to while their request is read (same filesystem as staging,
    so staging one is a link, not a copy)."""
    return _root() / "incoming"


def staging_path(sha256: str) -> Path:
    return _root() / "staging" / sha256[:2] / sha256


def stored_path(key: str) -> Path:
    return _root() / "files" / key


def _write_once(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically unless a file of that size is there (the
    name is derived from the content, so equal size means equal bytes)."""
    if path.exists() and path.stat().st_size == len(data):
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def stage_upload(data: bytes) -> str:
    """Keep an upload's bytes for intake; returns their SHA-256. Idempotent; a blob that
    is already there gets a fresh modification time (the cleanup's grace starts anew)."""
    digest = sha256_hex(data)
    path = staging_path(digest)
    _write_once(path, data)
    os.utime(path)
    return digest


def stage_file(path: Path, sha256: str) -> None:
    """Keep a complete, synced upload file (whose bytes hash to ``sha256``) for intake:
    linked into staging (copied across filesystems). Idempotent like :func:`stage_upload`."""
    target = staging_path(sha256)
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, target)
        except FileExistsError:
            pass
        except OSError:
            _write_once(target, path.read_bytes())
    os.utime(target)


def incoming_leftovers(*, older_than: float) -> list[Path]:
    """Upload files a request left behind when its process died mid-read."""
    root = incoming_dir()
    if not root.exists():
        return []
    return [path for path in root.iterdir() if path.stat().st_mtime < older_than]


def staged_blobs(*, older_than: float, limit: int) -> list[str]:
    """SHA-256s of staged blobs last touched before ``older_than`` (a Unix time), oldest
    first, at most ``limit``."""
    root = _root() / "staging"
    if not root.exists():
        return []
    found = [
        (path.stat().st_mtime, path.name)
        for path in root.glob("*/*")
        if not path.name.startswith(".") and path.stat().st_mtime < older_than
    ]
    return [name for _, name in sorted(found)[:limit]]


def delete_staged(sha256: str) -> bool:
    """Remove a staged blob; False when it was already gone."""
    try:
        staging_path(sha256).unlink()
    except FileNotFoundError:
        return False
    return True


def read_verified(path: Path, sha256: str) -> bytes:
    """The bytes at ``path``; raises :class:`StorageCorrupt` unless they hash to ``sha256``."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise StorageCorrupt(f"{path} is missing (expected sha256 {sha256})") from None
    if sha256_hex(data) != sha256:
        raise StorageCorrupt(f"{path} does not match its sha256 {sha256}")
    return data


def read_staged(*, sha256: str, key: str) -> bytes:
    """A staged upload's bytes (verified); a replayed intake whose staged blob was cleaned
    up meanwhile finds the stored copy instead."""
    target = stored_path(key)
    if not staging_path(sha256).exists() and target.exists():
        return read_verified(target, sha256)
    return read_verified(staging_path(sha256), sha256)


def store(*, key: str, data: bytes) -> None:
    """Write an upload's verified bytes to its storage key. Idempotent: a retry rewrites
    the same bytes to the same path."""
    _write_once(stored_path(key), data)


def read_stored(*, key: str, sha256: str) -> bytes:
    return read_verified(stored_path(key), sha256)
