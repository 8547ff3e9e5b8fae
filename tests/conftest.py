"""Fixtures every test directory shares: storage URLs on both backends.

`storage_url` / `storage` run a test once on SQLite and once on PostgreSQL (the
contract suites, STYLE.md); `sqlite_url` and `postgres_url` are for tests that
need one backend. One throwaway PostgreSQL server serves the whole session
(`postgres_server`); every test gets a fresh empty database on it.

Tests that need PostgreSQL or Spark carry the `postgres` / `spark` marker (a test
that uses `postgres_server` gets `postgres` automatically). Locally such a test is
skipped when its server cannot start; in CI (`CI=true`) it fails instead, and so
does a module that skips while being collected: a skip there would hide that a
whole backend went untested (`harness/ci.py`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from harness.ci import in_ci
from harness.ci import pytest_make_collect_report as pytest_make_collect_report
from harness.ci import pytest_runtest_makereport as pytest_runtest_makereport
from harness.postgres import PostgresServer, PostgresUnavailable
from riverbed.storage import Storage, open_storage

# Property tests check behaviour, never speed (docs/testing.md): hypothesis's
# per-example deadline (200 ms) fails them on a machine whose cores are busy.
settings.register_profile("riverbed", deadline=None)
settings.load_profile("riverbed")

# pytester: tests of the CI hooks run pytest inside pytest; harness.logs: a
# failing test's report shows its brokers' logs.
pytest_plugins = ["pytester", "harness.logs"]

# Spark's driver JVMs in tests (the session fixture's, and those of the jobs,
# examples and chaos runs that tests start, which inherit it): the quick
# compiler only and the serial collector. Each lives a minute or two, where
# C2's compiling and the parallel collector's threads cost a third of a
# delivery job test's CPU (133 -> 94 s), and the suite is CPU-bound on two
# cores (docs/testing.md). A value set outside is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")

_database_numbers = itertools.count(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if {"postgres_server", "postgres_url", "own_postgres"} & set(fixtures) and (
            item.get_closest_marker("postgres") is None
        ):
            item.add_marker(pytest.mark.postgres)
        if "spark" in fixtures:
            # Run in parallel (`make test`: pytest-xdist, --dist loadgroup), the
            # tests sharing a Spark session stay on one worker: one JVM (~1.3 GB,
            # 5-11 s to start) instead of one per worker.
            item.add_marker(pytest.mark.xdist_group("spark"))


# --------------------------------------------------------------------- PostgreSQL


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One throwaway PostgreSQL server for the session (skipped if it cannot start,
    except in CI)."""
    yield from _server()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server for one module alone, for tests that stop it, restart
    it or make it read-only."""
    yield from _server()


def _server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        server.start()
    except PostgresUnavailable as exc:
        message = f"PostgreSQL could not start: {exc}"
    else:
        message = ""
    if message:
        if in_ci():
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
