"""Fixtures every test directory shares: storage URLs on both backends.

`storage_url` / `storage` run a test once on SQLite and once on PostgreSQL (the
contract suites, STYLE.md); `sqlite_url` and `postgres_url` are for tests that
need one backend. One throwaway PostgreSQL server serves the whole session
(`postgres_server`); every test gets a fresh empty database on it.

Tests that need PostgreSQL or Spark carry the `postgres` / `spark` marker (a test
that uses `postgres_server` gets `postgres` automatically). Locally such a test is
skipped when its server cannot start; in CI (`CI=true`) it fails instead: a skip
there would hide that a whole backend went untested.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from harness.postgres import PostgresServer, PostgresUnavailable
from riverbed.storage import Storage, open_storage

IN_CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")
"""CI sets `CI=true`; there no test of a backend may be skipped."""

MUST_RUN_IN_CI = ("postgres", "spark")
"""Markers whose tests fail instead of skipping in CI."""

_database_numbers = itertools.count(1)


# --------------------------------------------------------------------- CI strictness


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if ("postgres_server" in fixtures or "postgres_url" in fixtures) and (
            item.get_closest_marker("postgres") is None
        ):
            item.add_marker(pytest.mark.postgres)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        needed = [m for m in MUST_RUN_IN_CI if item.get_closest_marker(m) is not None]
        if needed:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            report.outcome = "failed"
            report.longrepr = (
                f"a test marked {'/'.join(needed)} was skipped in CI, where it must run: {reason}"
            )
    return report


# --------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the session (skipped if it cannot start,
    except in CI)."""
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as exc:
        message = f"PostgreSQL could not start: {exc}"
    else:
        message = ""
    if message:
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The URL of a fresh, empty PostgreSQL database (dropped afterwards)."""
    name = f"test_{next(_database_numbers)}"
    url = postgres_server.new_database(name)
    yield url
    postgres_server.discard_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The URL of a fresh SQLite database file (absolute path)."""
    return f"sqlite:///{tmp_path}/riverbed.db"


# --------------------------------------------------------------------- both backends


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def storage_url(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh, empty database: once on SQLite, once on PostgreSQL."""
    url: str = request.getfixturevalue(f"{request.param}_url")
    return url


@pytest.fixture
def storage(storage_url: str) -> Iterator[Storage]:
    """The storage at `storage_url`, opened (and migrated) and closed afterwards."""
    opened = open_storage(storage_url)
    try:
        yield opened
    finally:
        opened.close()
