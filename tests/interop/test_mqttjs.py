"""MQTT.js (Node, npm `mqtt`) over TCP against `riverbed serve`: the interop
feature list (`features.py`), MQTT 5 and 3.1.1, each client a Node process
(`js/client.js`, driven by `remote.py`). `make test` installs its node_modules
(`make interop-deps`, npm ci from `js/package-lock.json`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from interop.clients import Endpoint, MakeClient
from interop.features import Features
from interop.installed import missing, require_command
from interop.remote import JS_DRIVER, remote_clients


@pytest.fixture(scope="module")
def driver() -> list[str]:
    node = require_command("node", "Debian: apt-get install nodejs npm")
    if not (JS_DRIVER.parent / "node_modules" / "mqtt" / "package.json").exists():
        missing("MQTT.js", "make interop-deps installs tests/interop/js/node_modules")
    return [node, str(JS_DRIVER)]


@pytest.fixture
def make_client(driver: list[str], endpoint: Endpoint, version: int) -> Iterator[MakeClient]:
    yield from remote_clients(driver, endpoint, version)


class TestMqttjs(Features):
    pass
