"""Fixtures of the admin API's tests: a `riverbed serve --http` subprocess on
the parametrized backend (`storage_url`) and an HTTP client of its API. A
test module that needs the broker started otherwise defines its own `broker`;
`api` then follows it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from harness.broker import BrokerProcess


@pytest.fixture
def broker(storage_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(storage_url, http=True) as running:
        yield running


@pytest.fixture
def api(broker: BrokerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=broker.http_url, timeout=30) as client:
        yield client
