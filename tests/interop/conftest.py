"""The broker the interop tests share, and what they need installed.

One `riverbed serve` per test module (SQLite), with everything the feature list
touches switched on: a TLS listener (certificates from `harness/certificates.py`),
a password file with one user (anonymous clients are let in too, as in every
broker the harness starts), and the shared subscriptions' timers shortened
(`harness/sharedsub.py`); a module whose clients speak MQTT over WebSockets
adds a WebSocket listener by overriding `websocket_listener`. Tests keep apart
by their topics and client ids (`names`), so they can share it; the one that
restarts it leaves it running.

A client that is not installed skips its tests locally and fails them in CI
(`CI=true`), as a backend does (`harness/ci.py`): a skip there would hide that a
whole client went untested.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import pytest

from harness.broker import BrokerProcess
from harness.certificates import have_openssl, make_certificates
from harness.net import free_port, wait_listening
from harness.sharedsub import short_timers_config
from interop.clients import PASSWORD, USERNAME, Endpoint
from interop.installed import missing
from riverbed.mqtt.passwords import set_password


@pytest.fixture(scope="module")
def websocket_listener() -> str | None:
    """The `[listeners.ws]` keys of the broker's config (TOML lines), for a
    module whose clients speak MQTT over WebSockets: the broker then also listens
    with `--ws` (`endpoint.broker.ws_port`). None: no WebSocket listener."""
    return None


@pytest.fixture(scope="module")
def endpoint(
    tmp_path_factory: pytest.TempPathFactory, websocket_listener: str | None
) -> Iterator[Endpoint]:
    if not have_openssl():
        missing("openssl", "the TLS listener's certificates are made with it")
    directory = tmp_path_factory.mktemp("interop")
    certs = make_certificates(directory)
    passwords = directory / "passwd"
    set_password(passwords, USERNAME, PASSWORD.encode())
    config = short_timers_config(directory)
    config.write_text(config.read_text() + f'\n[auth]\npassword_file = "{passwords}"\n')
    if websocket_listener is not None:
        config.write_text(config.read_text() + f"\n[listeners.ws]\n{websocket_listener}")
    tls_port = free_port()
    args = ("--config", str(config), *certs.listener_args(tls_port))
    ws = websocket_listener is not None
    with BrokerProcess(f"sqlite:///{directory}/riverbed.db", extra_args=args, ws=ws) as broker:
        assert broker.process is not None
        # The plain listener is up; the TLS one starts right after it.
        wait_listening(broker.process, tls_port, 10, "broker", broker.tail, broker.kill)
        yield Endpoint(broker, tls_port, certs.ca)


_names = itertools.count(1)


@pytest.fixture
def names(request: pytest.FixtureRequest) -> str:
    """A prefix for the test's topics and client ids, unique in the module."""
    words = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")
    return f"{words[-40:]}-{next(_names)}"


@pytest.fixture(params=[5, 4], ids=["mqtt5", "mqtt311"])
def version(request: pytest.FixtureRequest) -> int:
    """The MQTT protocol level a client module's tests run at: 5, then 3.1.1."""
    return int(request.param)
