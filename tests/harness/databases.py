"""Fresh databases for fixtures wider than a test: a module's cases that
change nothing share one (a refusal test's cases, each checking that nothing
changed), on SQLite or on the session's PostgreSQL server.

    @pytest.fixture(scope="module", params=BACKENDS)
    def unchanged(request, tmp_path_factory):
        with contextlib.ExitStack() as stack:
            url = fresh_database(request, tmp_path_factory, stack, "dlq")
            ...
"""

from __future__ import annotations

import contextlib
import uuid

import pytest

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
"""The `params` of a fixture run once per backend (`request.param`)."""


def fresh_database(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    stack: contextlib.ExitStack,
    label: str,
) -> str:
    """The URL of a new empty database on the backend `request.param` names:
    a SQLite file in a temporary directory, or a database on the session's
    PostgreSQL server, dropped when `stack` closes."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path_factory.mktemp(label)}/riverbed.db"
    server = request.getfixturevalue("postgres_server")
    name = f"{label.replace('-', '_')}_{uuid.uuid4().hex[:12]}"
    url: str = server.new_database(name)
    stack.callback(server.discard_database, name)
    return url
