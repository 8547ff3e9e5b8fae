"""aiomqtt (asyncio, on paho-mqtt) against `riverbed serve`: the interop feature
list (`features.py`), MQTT 5 and 3.1.1, each client in its own process
(`aiomqtt_client.py`, driven by `remote.py`)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator

import pytest

from interop.clients import Endpoint, MakeClient
from interop.features import Features
from interop.installed import missing
from interop.remote import AIOMQTT_DRIVER, remote_clients


@pytest.fixture(scope="module")
def driver() -> list[str]:
    if importlib.util.find_spec("aiomqtt") is None:
        missing("aiomqtt", "the dev extra installs it: pip install -e '.[dev]'")
    return [sys.executable, str(AIOMQTT_DRIVER)]


@pytest.fixture
def make_client(driver: list[str], endpoint: Endpoint, version: int) -> Iterator[MakeClient]:
    yield from remote_clients(driver, endpoint, version)


class TestAiomqtt(Features):
    pass
