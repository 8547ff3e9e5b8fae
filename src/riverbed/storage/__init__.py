"""Storage backends chosen by URL: `sqlite:///path` (default) or `postgresql://...`."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from riverbed.errors import InvalidConfig
from riverbed.storage.base import Storage
from riverbed.storage.urls import redact_url

DEFAULT_URL = "sqlite:///./riverbed-data/riverbed.db"
ENV_VAR = "RIVERBED_DB"

__all__ = ["DEFAULT_URL", "ENV_VAR", "Storage", "default_url", "open_storage", "redact_url"]


def default_url() -> str:
    """`RIVERBED_DB` if set, else the embedded default."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def open_storage(url: str | None = None) -> Storage:
    """Open (creating and migrating as needed) the storage a URL names.

    `sqlite:///relative/path.db`, `sqlite:////absolute/path.db`, with an optional
    `?synchronous=full`; `postgresql://user@host:port/db` (or `postgres://`).
    """
    url = url or default_url()
    shown = redact_url(url)  # what messages print
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        raise InvalidConfig(f"database URL {shown!r} is malformed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme == "sqlite":
        from riverbed.storage.sqlite import SqliteStorage

        if parts.netloc:
            raise InvalidConfig(
                f"database URL {shown!r}: a sqlite URL has no host; write sqlite:///relative.db"
                " or sqlite:////absolute.db"
            )
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        if not path or path.endswith("/"):
            raise InvalidConfig(f"database URL {shown!r} names no database file")
        options = parse_qs(parts.query)
        unknown = set(options) - {"synchronous"}
        if unknown:
            raise InvalidConfig(
                f"database URL {shown!r}: unknown option(s) {sorted(unknown)}; known: synchronous"
            )
        synchronous = options.get("synchronous", ["normal"])[-1].upper()
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidConfig(
                f"database URL {shown!r}: synchronous={synchronous.lower()!r}"
                " must be normal or full"
            )
        return SqliteStorage(url, Path(path), synchronous)
    if scheme in ("postgresql", "postgres"):
        from riverbed.storage.postgres import PostgresStorage

        return PostgresStorage(url)
    raise InvalidConfig(
        f"database URL {shown!r}: unsupported scheme {parts.scheme!r}; use sqlite:///PATH"
        " or postgresql://..."
    )
