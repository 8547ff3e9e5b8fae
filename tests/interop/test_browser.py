"""MQTT.js in headless Chromium over WebSockets against `riverbed serve`: the
interop feature list (`features.py`), MQTT 5 and 3.1.1.

Each client is a page of this module's own loopback HTTP server, which loads
MQTT.js's browser bundle (`make interop-deps` installs it) and connects to
`ws://127.0.0.1:PORT/mqtt`, in a browser context of its own (`page_client.py`).
The broker's `listeners.ws.allowed_origins` holds that server's origin; a page
from another origin is refused.

Two features are done the browser's way (docs/interop.md says so):

- the abrupt close is the page's browser context closed without a DISCONNECT
  (a tab closed, a browser quit), not a SIGKILL of a client process;
- TLS is WSS, from a second broker whose WebSocket listener serves it with a
  certificate our test CA signed. Chromium does not read CA files: it is launched
  trusting that certificate's public key (`--ignore-certificate-errors-spki-list`,
  `harness.browser.accept_key_of`), and a Chromium launched without that flag
  is shown to refuse the certificate.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from harness.broker import BrokerProcess
from harness.browser import accept_key_of, another_chromium, chromium
from harness.browser import missing as browser_missing
from harness.certificates import Certificates, have_openssl, make_certificates
from interop.clients import Endpoint, MakeClient
from interop.features import Features
from interop.installed import missing
from interop.page_client import MQTTJS_BUNDLE, PageClient, PageServer, WebSocketUrls

if TYPE_CHECKING:
    from playwright.sync_api import Browser

HANDSHAKE_403 = "Unexpected response code: 403"
"""What Chromium's console says of a WebSocket handshake answered with 403."""


@pytest.fixture(scope="module")
def page_server() -> Iterator[PageServer]:
    with PageServer() as server:
        yield server


@pytest.fixture(scope="module")
def websocket_listener(page_server: PageServer) -> str:
    """The interop broker's WebSocket listener takes pages of `page_server` only."""
    return f'allowed_origins = ["{page_server.origin}"]\n'


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    if not have_openssl():
        missing("openssl", "the WSS listener's certificates are made with it")
    return make_certificates(tmp_path_factory.mktemp("wss-certificates"))


@pytest.fixture(scope="module")
def wss_broker(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates, page_server: PageServer
) -> Iterator[BrokerProcess]:
    """A broker whose WebSocket listener serves WSS (one listener per broker)."""
    directory = tmp_path_factory.mktemp("wss")
    config = directory / "riverbed.toml"
    config.write_text(
        "[listeners.ws]\n"
        f'certfile = "{certificates.server}"\n'
        f'keyfile = "{certificates.server_key}"\n'
        f'allowed_origins = ["{page_server.origin}"]\n'
    )
    db = f"sqlite:///{directory}/riverbed.db"
    with BrokerProcess(db, extra_args=("--config", str(config)), ws=True) as broker:
        yield broker


@pytest.fixture(scope="module")
def installed() -> None:
    reason = browser_missing()
    if reason is not None:
        missing("a browser for the MQTT.js page", reason)
    if not MQTTJS_BUNDLE.exists():
        missing("MQTT.js", "make interop-deps installs tests/interop/js/node_modules")


@pytest.fixture(scope="module")
def browser(installed: None, certificates: Certificates) -> Iterator[Browser]:
    with chromium(args=accept_key_of(certificates.server)) as running:
        yield running


@pytest.fixture(scope="module")
def urls(endpoint: Endpoint, wss_broker: BrokerProcess) -> WebSocketUrls:
    return WebSocketUrls(
        ws=f"ws://127.0.0.1:{endpoint.broker.ws_port}/mqtt",
        wss=f"wss://127.0.0.1:{wss_broker.ws_port}/mqtt",
    )


@pytest.fixture
def make_client(
    browser: Browser, page_server: PageServer, urls: WebSocketUrls, version: int
) -> Iterator[MakeClient]:
    made: list[PageClient] = []

    def make(client_id: str) -> PageClient:
        made.append(PageClient(browser, page_server.url, urls, client_id, version))
        return made[-1]

    yield make
    for client in made:
        client.close()
    # MQTT.js and the pages worked without a console error.
    assert [e for client in made for e in client.console_errors()] == []


class TestMqttjsInChromium(Features):
    def test_page_from_another_origin_is_refused(
        self,
        browser: Browser,
        urls: WebSocketUrls,
        endpoint: Endpoint,
        names: str,
        version: int,
        page_server: PageServer,
    ) -> None:
        with PageServer() as elsewhere:
            stranger = PageClient(browser, elsewhere.url, urls, f"{names}-stranger", version)
            answer = stranger.connect_answer(urls.ws)
            errors = stranger.console_errors()
            stranger.close()
        assert answer["event"] == "error", answer
        assert any(HANDSHAKE_403 in error for error in errors), errors
        endpoint.broker.wait_logged(f"origin '{elsewhere.origin}' is not in")
        # The origin allowed still gets in.
        welcome = PageClient(browser, page_server.url, urls, f"{names}-welcome", version)
        assert welcome.connect_answer(urls.ws)["event"] == "connack"
        welcome.disconnect()
        assert welcome.console_errors() == []


def test_wss_needs_the_certificate_trusted(
    browser: Browser, page_server: PageServer, urls: WebSocketUrls
) -> None:
    """Without the flag that trusts its key, Chromium refuses the WSS listener's
    certificate (our test CA is no CA it knows): the TLS row checks a certificate."""
    with another_chromium(browser) as untrusting:
        client = PageClient(untrusting, page_server.url, urls, "untrusting", 5)
        answer = client.connect_answer(urls.wss)
        errors = client.console_errors()
        client.close()
    assert answer["event"] == "error", answer
    assert any("ERR_CERT_AUTHORITY_INVALID" in error for error in errors), errors
