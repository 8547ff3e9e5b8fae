"""Database URLs: parsed once into a `StorageUrl`, and shown without their password.

`StorageUrl.parse` checks a URL as far as it can without connecting: the
scheme (`sqlite`, `postgresql` or `postgres`), and for SQLite the file and its
options (`?synchronous=normal|full`, `?max_size=SIZE`). Every message that names
a database prints `redact_url(url)` (a `StorageUrl`'s `shown`). Text that comes
from a driver goes through `redact_password` too: libpq quotes pieces of a
malformed URL back (`invalid percent-encoded token: "<password>"`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, parse_qs, unquote, urlsplit

from riverbed.errors import InvalidConfig

_MASK = "***"

_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
"""libpq also takes the password as a query parameter: `...?password=secret`."""


def redact_url(url: str) -> str:
    """`url` with its password shown as `***`: `postgresql://user:***@host/db`.

    Works on malformed URLs too (they end up in error messages): the user info is
    whatever precedes the last `@` before the query, so a password holding an
    unencoded `/` or `@` is still hidden.
    """
    scheme, separator, rest = url.partition("://")
    if separator:
        authority_and_path, question, query = rest.partition("?")
        userinfo, at, host_and_path = authority_and_path.rpartition("@")
        if at and ":" in userinfo:
            user = userinfo.partition(":")[0]
            rest = f"{user}:{_MASK}@{host_and_path}{question}{query}"
    return _QUERY_PASSWORD.sub(rf"\g<1>{_MASK}", scheme + separator + rest)


def redact_password(text: str, url: str) -> str:
    """`text` (a driver's message about `url`) with the URL's password, as written
    and percent-decoded, replaced by `***`."""
    for secret in _passwords(url):
        text = text.replace(secret, _MASK)
    return text


def _passwords(url: str) -> list[str]:
    found: list[str] = []
    _, separator, rest = url.partition("://")
    if separator:
        userinfo, at, _ = rest.partition("?")[0].rpartition("@")
        if at and ":" in userinfo:
            found.append(userinfo.partition(":")[2])
    found += [m.group(0).partition("=")[2] for m in _QUERY_PASSWORD.finditer(url)]
    secrets = {s for p in found for s in (p, unquote(p)) if s}
    return sorted(secrets, key=len, reverse=True)  # longest first: no partial masking


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


Backend = Literal["sqlite", "postgresql"]


@dataclass(frozen=True, slots=True)
class StorageUrl:
    """A database URL Riverbed can use, parsed: `sqlite:///relative/path.db`,
    `sqlite:////absolute/path.db` (with optional `?synchronous=full` and
    `?max_size=SIZE`, a cap on the file: `512MB`, `2GiB` or bytes) or
    `postgresql://user@host:port/db` (or `postgres://`)."""

    text: str
    """The URL as given (with its password: never print it; print `shown`)."""
    backend: Backend
    path: Path | None = None
    """SQLite: the database file."""
    synchronous: str = "NORMAL"
    """SQLite: `NORMAL` or `FULL`."""
    max_size: int | None = None
    """SQLite: the cap on the file in bytes, if any."""

    @classmethod
    def parse(cls, text: str) -> StorageUrl:
        """`text` parsed; `InvalidConfig` naming the URL (redacted) and the rule otherwise."""
        parts, shown = _split(text)
        if parts.scheme.lower() != "sqlite":
            return cls(text, "postgresql")
        path, synchronous, max_size = _sqlite_options(parts, shown)
        return cls(text, "sqlite", path, synchronous, max_size)

    @property
    def shown(self) -> str:
        """The URL with its password as `***`."""
        return redact_url(self.text)

    @property
    def is_sqlite(self) -> bool:
        return self.backend == "sqlite"

    def __str__(self) -> str:
        return self.shown


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
