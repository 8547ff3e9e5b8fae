"""Fixtures shared by the log's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from riverbed.log.log import Log
from riverbed.storage import Storage


@pytest.fixture
def log(storage: Storage) -> Iterator[Log]:
    """A `Log` on the test's storage (which the `storage` fixture closes)."""
    opened = Log(storage)
    try:
        yield opened
    finally:
        opened.appender.close()
