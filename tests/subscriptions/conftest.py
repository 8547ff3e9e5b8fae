"""Fixtures shared by the delivering-subscription tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.endpoint import Endpoint


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    """A real local HTTP endpoint that fails on command (`harness/endpoint.py`)."""
    with Endpoint() as running:
        yield running
