"""Storage backends chosen by URL: `sqlite:///path` (default) or `postgresql://...`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import SplitResult, parse_qs, urlsplit

from riverbed.errors import InvalidConfig
from riverbed.storage.base import Storage
from riverbed.storage.urls import redact_url

DEFAULT_URL = "sqlite:///./riverbed-data/riverbed.db"
ENV_VAR = "RIVERBED_DB"

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "Storage",
    "default_url",
    "open_storage",
    "parse_size",
    "redact_url",
    "size_in_bytes",
]

_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
MIN_SIZE = 64 * 1024
"""The smallest size cap accepted: an empty database's schema takes some 40 kB."""


def size_in_bytes(text: str, what: str) -> int:
    """Bytes from `512MB`, `2GiB`, `1000000` (kB/MB/GB/TB: powers of 1000, KiB/MiB/
    GiB/TiB: of 1024); `InvalidConfig` naming `what` otherwise. Zero passes."""
    match = _SIZE.fullmatch(text)
    unit = _SIZE_UNITS.get(match.group(2).lower()) if match else None
    if match is None or unit is None:
        raise InvalidConfig(
            f"{what} {text!r} is not a size: use bytes or a number with kB, MB, GB, TB,"
            " KiB, MiB, GiB or TiB (e.g. 512MB)"
        )
    return int(match.group(1)) * unit


def parse_size(text: str, what: str) -> int:
    """`size_in_bytes` for a cap on a database: at least `MIN_SIZE`."""
    size = size_in_bytes(text, what)
    if size < MIN_SIZE:
        raise InvalidConfig(f"{what} {text!r} is below the least size, {MIN_SIZE} bytes (64KiB)")
    return size


def default_url() -> str:
    """`RIVERBED_DB` if set, else the embedded default."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def open_storage(url: str | None = None, *, create: bool = True) -> Storage:
    """Open (creating and migrating as needed) the storage a URL names.

    With `create=False` a database that does not exist, or has no Riverbed
    tables, is refused with `DatabaseNotFound` and nothing is created (what a
    command that only reads or changes existing things wants). Either way the
    storage's `created` says whether this open created it.

    `sqlite:///relative/path.db`, `sqlite:////absolute/path.db`, with optional
    `?synchronous=full` and `?max_size=SIZE` (a cap on the file, `512MB`, `2GiB`
    or bytes: writes past it are refused with `StorageFull`, docs/storage.md);
    `postgresql://user@host:port/db` (or `postgres://`).
    """
    url = url or default_url()
    parts, shown = _split(url)
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        from riverbed.storage.sqlite import SqliteStorage

        path, synchronous, max_size = _sqlite_options(parts, shown)
        return SqliteStorage(url, path, synchronous, max_size, create=create)
    from riverbed.storage.postgres import PostgresStorage

    return PostgresStorage(url, create=create)


def _split(url: str) -> tuple[SplitResult, str]:
    """The URL's parts and how messages show it; `InvalidConfig` for a URL that
    names no storage Riverbed has."""
    shown = redact_url(url)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidConfig(f"database URL {shown!r} is malformed: {exc}") from None
    if parts.scheme.lower() not in ("sqlite", "postgresql", "postgres"):
        raise InvalidConfig(
            f"database URL {shown!r}: unsupported scheme {parts.scheme!r}; use sqlite:///PATH"
            " or postgresql://..."
        )
    return parts, shown


def _sqlite_options(parts: SplitResult, shown: str) -> tuple[Path, str, int | None]:
    """A sqlite URL's file, `synchronous` and `max_size`."""
    if parts.netloc:
        raise InvalidConfig(
            f"database URL {shown!r}: a sqlite URL has no host; write sqlite:///relative.db"
            " or sqlite:////absolute.db"
        )
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path or path.endswith("/"):
        raise InvalidConfig(f"database URL {shown!r} names no database file")
    options = parse_qs(parts.query)
    unknown = set(options) - {"synchronous", "max_size"}
    if unknown:
        raise InvalidConfig(
            f"database URL {shown!r}: unknown option(s) {sorted(unknown)};"
            " known: max_size, synchronous"
        )
    synchronous = options.get("synchronous", ["normal"])[-1].upper()
    if synchronous not in ("NORMAL", "FULL"):
        raise InvalidConfig(
            f"database URL {shown!r}: synchronous={synchronous.lower()!r} must be normal or full"
        )
    max_size = None
    if "max_size" in options:
        max_size = parse_size(options["max_size"][-1], f"database URL {shown!r}: max_size")
    return Path(path), synchronous, max_size
