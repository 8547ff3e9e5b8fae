"""Storage backends chosen by URL: `sqlite:///path` (default) or `postgresql://...`.

A URL is parsed once into a `StorageUrl` (`storage/urls.py`), which the CLI,
the broker's configuration and the Spark options all use; `default_url()` is
the one place the default applies (`$RIVERBED_DB`, else the embedded file).
"""

from __future__ import annotations

import os

from riverbed.storage.base import Storage
from riverbed.storage.urls import MIN_SIZE, StorageUrl, parse_size, redact_url, size_in_bytes

DEFAULT_URL = "sqlite:///./riverbed-data/riverbed.db"
ENV_VAR = "RIVERBED_DB"

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "MIN_SIZE",
    "Storage",
    "StorageUrl",
    "default_url",
    "open_storage",
    "parse_size",
    "redact_url",
    "size_in_bytes",
]


def default_url() -> str:
    """`RIVERBED_DB` if set, else the embedded default."""
    return os.environ.get(ENV_VAR) or DEFAULT_URL


def open_storage(url: str | StorageUrl | None = None, *, create: bool = True) -> Storage:
    """Open (creating and migrating as needed) the storage a URL names (None:
    `default_url()`); a URL Riverbed cannot use is refused with `InvalidConfig`
    (`StorageUrl.parse`).

    With `create=False` a database that does not exist, or has no Riverbed
    tables, is refused with `DatabaseNotFound` and nothing is created (what a
    command that only reads or changes existing things wants). Either way the
    storage's `created` says whether this open created it.
    """
    parsed = url if isinstance(url, StorageUrl) else StorageUrl.parse(url or default_url())
    if parsed.backend == "sqlite":
        from riverbed.storage.sqlite import SqliteStorage

        assert parsed.path is not None
        return SqliteStorage(
            parsed.text, parsed.path, parsed.synchronous, parsed.max_size, create=create
        )
    from riverbed.storage.postgres import PostgresStorage

    return PostgresStorage(parsed.text, create=create)
