"""The CLI tests' database: a fresh SQLite file per test (modules that need
topics in it first define their own `db`)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/x.db"
