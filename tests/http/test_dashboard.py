"""The web dashboard at `/`, in a real headless Chromium against a real
`riverbed serve --http` subprocess, with real MQTT clients (paho) and a real
HTTP endpoint for the dead-letter queue.

Locally these tests skip when Playwright or chromium is missing; in CI
(`CI=true`) they fail instead, as PostgreSQL and Spark tests do.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from harness.broker import BrokerProcess, Client
from harness.browser import ConsoleErrors, chromium, missing
from harness.ci import in_ci
from harness.delivery import Driver, produce_groups, subscribe
from harness.endpoint import Endpoint
from harness.waiting import DEFAULT_TIMEOUT, eventually
from riverbed.http.auth import Role, add_token
from riverbed.http.dashboard import STATIC
from riverbed.storage import open_storage
from riverbed.subscriptions.definition import RetryPolicy
from riverbed.subscriptions.dlq import parked

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

WAIT_MS = DEFAULT_TIMEOUT * 1000
"""Playwright's waits, in its milliseconds: as generous as `eventually`'s."""


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    reason = missing()
    if reason is not None:
        if in_ci():
            pytest.fail(f"the dashboard tests must run in CI: {reason}", pytrace=False)
        pytest.skip(reason)
    with chromium() as running:
        yield running


@pytest.fixture
def broker(sqlite_url: str) -> Iterator[BrokerProcess]:
    with BrokerProcess(sqlite_url, http=True) as running:
        yield running


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        yield context.new_page()
    finally:
        context.close()


def open_dashboard(page: Page, broker: BrokerProcess, *expected: str) -> ConsoleErrors:
    errors = ConsoleErrors(page, expected)
    answer = page.goto(f"{broker.http_url}/")
    assert answer is not None and answer.status == 200
    return errors


def rounds(page: Page, count: int) -> None:
    """Wait until the page has refreshed `count` more times."""
    from playwright.sync_api import expect

    updated = page.locator("#updated")
    for _ in range(count):
        before = updated.text_content()
        expect(updated).not_to_have_text(before or "", timeout=WAIT_MS)


def number(page: Page, selector: str) -> float:
    """The number an element shows ("12,345", "3.5"); -1 for none yet ("–")."""
    text = (page.locator(selector).text_content() or "").replace(",", "")
    found = re.search(r"\d+(\.\d+)?", text)
    return float(found.group()) if found else -1


class Publisher:
    """A paho client publishing QoS 1 messages to `topic` in a thread, one after
    the other (each once acknowledged), until `stop`."""

    def __init__(self, port: int, topic: str) -> None:
        self.client = Client(port, "dashboard-load")
        self.client.connect()
        self.topic = topic
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            info = self.client.publish(self.topic, b"%d" % self.sent, qos=1)
            info.wait_for_publish(DEFAULT_TIMEOUT)
            self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEFAULT_TIMEOUT)
        self.client.disconnect()


# --------------------------------------------------------------------- the page itself


def test_page_and_files_are_served_with_security_and_cache_headers(
    broker: BrokerProcess,
) -> None:
    with httpx.Client(base_url=broker.http_url, timeout=30) as http:
        page = http.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["cache-control"] == "no-cache"
        # Everything the page loads comes from this server, and exists.
        assets = re.findall(r'(?:src|href)="([^"]+)"', page.text)
        assert assets and all(a.startswith("/static/") for a in assets), assets
        for asset in assets:
            answer = http.get(asset)
            assert answer.status_code == 200, asset
            assert answer.headers["x-content-type-options"] == "nosniff"
            vendored = asset.startswith("/static/vendor/")
            cache = answer.headers["cache-control"]
            assert ("immutable" in cache) == vendored, (asset, cache)
        # uPlot's licence ships beside it.
        (vendor,) = (STATIC / "vendor").iterdir()
        licence = http.get(f"/static/vendor/{vendor.name}/LICENSE")
        assert licence.status_code == 200 and "MIT License" in licence.text
        assert http.get("/static/nothing-here.js").status_code == 404


def test_vendored_files_are_the_locked_npm_versions_the_page_names() -> None:
    """`make dashboard-assets` was run after the last change to dashboard/'s npm
    lock: each locked package has its directory, with its licence, and the page
    loads from those directories only."""
    root = Path(__file__).resolve().parents[2]
    lock = json.loads((root / "dashboard" / "package-lock.json").read_text())
    locked = {
        path.removeprefix("node_modules/"): entry["version"]
        for path, entry in lock["packages"].items()
        if path.startswith("node_modules/")
    }
    expected = {f"{name}-{version}" for name, version in locked.items()}
    assert {d.name for d in (STATIC / "vendor").iterdir()} == expected
    for directory in expected:
        assert (STATIC / "vendor" / directory / "LICENSE").is_file()
    page = (STATIC / "index.html").read_text()
    named = set(re.findall(r"/static/vendor/([^/]+)/", page))
    assert named == expected


def test_page_loads_and_updates_without_console_errors(page: Page, broker: BrokerProcess) -> None:
    from playwright.sync_api import expect

    errors = open_dashboard(page, broker)
    # Built-in topics: the topics panel has rows once the page has asked.
    expect(page.locator("#topics-rows")).to_contain_text("sys", timeout=WAIT_MS)
    expect(page.locator("#stat-connections")).to_have_text(re.compile(r"^\d+$"), timeout=WAIT_MS)
    rounds(page, 3)
    for panel in ("overview", "subscriptions", "dlq", "clients", "groups", "topics"):
        expect(page.locator(f"#{panel}-status")).to_have_text("")
    errors.check()


def test_numbers_and_plot_change_while_a_client_publishes(
    page: Page, broker: BrokerProcess
) -> None:
    from playwright.sync_api import expect

    errors = open_dashboard(page, broker)
    plot = page.locator("#rates-plot")
    expect(page.locator("#stat-publish-in")).to_have_text(re.compile(r"^[\d,]+$"), timeout=WAIT_MS)
    before = number(page, "#stat-publish-in")
    points = int(plot.get_attribute("data-points") or 0)
    publisher = Publisher(broker.port, "load/1")
    try:
        eventually(lambda: publisher.sent >= 20, what="20 messages published")
        eventually(
            lambda: number(page, "#stat-publish-in") >= before + 20,
            what="the messages-in total counting the publisher's messages",
            explain=lambda: page.locator("#stat-publish-in").text_content(),
        )
        eventually(
            lambda: int(plot.get_attribute("data-points") or 0) >= points + 2,
            what="two more points on the rates plot",
        )
        # A rate above zero while the publisher runs, drawn on a canvas.
        eventually(
            lambda: number(page, "#stat-rate-in") > 0,
            what="a messages-in rate above 0",
        )
        expect(plot.locator("canvas")).to_have_count(1)
        expect(page.locator("#stat-connections")).not_to_have_text("0", timeout=WAIT_MS)
    finally:
        publisher.stop()
    errors.check()


# --------------------------------------------------------------------- clients


def test_search_then_disconnect_a_client_from_the_page(page: Page, broker: BrokerProcess) -> None:
    from playwright.sync_api import expect

    victim = Client(broker.port, "sensor-victim")
    bystander = Client(broker.port, "sensor-bystander")
    victim.connect()
    bystander.connect()
    try:
        errors = open_dashboard(page, broker)
        row = page.locator("#clients-rows tr[data-client-id='sensor-victim']")
        other = page.locator("#clients-rows tr[data-client-id='sensor-bystander']")
        expect(row).to_have_count(1, timeout=WAIT_MS)
        expect(other).to_have_count(1)

        page.fill("#clients-search", "victim")
        expect(other).to_have_count(0, timeout=WAIT_MS)
        expect(row).to_have_count(1)

        # paho's network loop would connect again after a second: not this one.
        assert victim.paho is not None
        victim.paho.reconnect_delay_set(min_delay=3600, max_delay=3600)
        row.get_by_role("button", name="Disconnect").click()
        assert victim.wait_disconnected(DEFAULT_TIMEOUT), "the client was not disconnected"
        assert victim.disconnects == [0x98]  # Administrative action
        victim.close()
        expect(page.locator("#clients-status")).to_have_text(
            "disconnected sensor-victim", timeout=WAIT_MS
        )
        expect(row).to_have_count(0, timeout=WAIT_MS)
        assert not bystander.wait_disconnected(0)
        errors.check()
    finally:
        victim.close()
        bystander.disconnect()


# --------------------------------------------------------------------- groups and topics


def test_a_shared_group_and_a_topic_show_their_details(page: Page, broker: BrokerProcess) -> None:
    from playwright.sync_api import expect

    with httpx.Client(base_url=broker.http_url, timeout=30) as http:
        made = http.post(
            "/api/v1/topics", json={"name": "orders", "partitions": 4, "binding": "orders/#"}
        )
        assert made.status_code == 201, made.text
    members = [Client(broker.port, f"worker-{n}") for n in range(2)]
    try:
        for member in members:
            member.connect()
            member.subscribe("$share/workers/orders/#", qos=1)
        errors = open_dashboard(page, broker)
        group = page.locator("#groups-rows tr", has_text="workers")
        expect(group).to_contain_text("orders/#", timeout=WAIT_MS)
        group.click()
        detail = page.locator("#group-detail")
        expect(detail).to_contain_text("$share/workers/orders/#", timeout=WAIT_MS)
        # Both members, by client id, once the Leader has given each its streams.
        for member in members:
            expect(detail).to_contain_text(member.client_id, timeout=WAIT_MS)
        expect(detail).to_contain_text("orders/0/3")

        topic = page.locator("#topics-rows tr", has_text="orders")
        expect(topic).to_contain_text("g0: 4 (produce)", timeout=WAIT_MS)
        topic.click()
        streams = page.locator("#topic-detail tbody tr")
        expect(streams).to_have_count(4, timeout=WAIT_MS)
        expect(streams.first).to_contain_text("orders/0/0")
        errors.check()
    finally:
        for member in members:
            member.disconnect()


# --------------------------------------------------------------------- dead-letter queue


@pytest.fixture
def parked_three(broker: BrokerProcess) -> Iterator[tuple[Endpoint, Callable[[], int]]]:
    """Subscription `billing` delivering `orders` to a real endpoint that refused
    (HTTP 400, not retried) three messages, now parked in its DLQ; the endpoint
    answers 200 from now on. Also returns a function that delivers what is due
    and says how many messages are still parked.

    The deliveries run batch by batch (`harness.delivery.Driver`) on a thread of
    their own: the driver runs an asyncio loop, which cannot run in the thread
    where Playwright's sync API has its own."""
    with ThreadPoolExecutor(1) as worker, Endpoint() as endpoint:
        storage = worker.submit(open_storage, broker.db_url).result()
        made = worker.submit(Driver, storage, "billing")

        def setup() -> None:
            subscribe(
                storage,
                endpoint.url,
                shards=1,
                partitions=1,
                grouped=False,
                retry=RetryPolicy(retry_on_status=(503,), max_attempts=1),
            )
            endpoint.fail(b"", 400)
            produce_groups(storage, groups=3, first=0, count=1)

        def deliver() -> int:
            def run() -> int:
                made.result().until_idle()
                return len(parked(storage, "billing"))

            return worker.submit(run).result()

        try:
            worker.submit(setup).result()
            assert deliver() == 3
            endpoint.heal()
            yield endpoint, deliver
        finally:
            worker.submit(lambda: (made.result().close(), storage.close())).result()


def test_replay_button_replays_the_dead_letter_queue(
    page: Page, broker: BrokerProcess, parked_three: tuple[Endpoint, Callable[[], int]]
) -> None:
    from playwright.sync_api import expect

    endpoint, deliver = parked_three
    errors = open_dashboard(page, broker)
    expect(page.locator("#dlq-subscription")).to_have_value("billing", timeout=WAIT_MS)
    expect(page.locator("#dlq-summary")).to_contain_text("3 parked", timeout=WAIT_MS)
    expect(page.locator("#dlq-rows tr")).to_have_count(3)

    page.click("#dlq-replay")
    expect(page.locator("#dlq-status")).to_have_text("replayed 3", timeout=WAIT_MS)
    expect(page.locator("#dlq-rows")).to_contain_text("empty", timeout=WAIT_MS)
    # Replayed: back in the flow, and delivered to the endpoint this time.
    assert deliver() == 0
    payloads = sorted(r.payload for r in endpoint.delivered())
    assert payloads == [b"g0:0:", b"g1:0:", b"g2:0:"]
    errors.check()


def test_purge_button_asks_again_then_drops_the_dead_letter_queue(
    page: Page, broker: BrokerProcess, parked_three: tuple[Endpoint, Callable[[], int]]
) -> None:
    from playwright.sync_api import expect

    endpoint, deliver = parked_three
    errors = open_dashboard(page, broker)
    expect(page.locator("#dlq-summary")).to_contain_text("3 parked", timeout=WAIT_MS)
    purge = page.locator("#dlq-purge")
    purge.click()
    expect(purge).to_have_text("Really purge 3?")
    assert deliver() == 3  # one click purges nothing
    purge.click()
    expect(page.locator("#dlq-status")).to_have_text("purged 3", timeout=WAIT_MS)
    expect(page.locator("#dlq-rows")).to_contain_text("empty", timeout=WAIT_MS)
    assert deliver() == 0
    assert endpoint.delivered() == []  # dropped, not delivered
    errors.check()


# --------------------------------------------------------------------- tokens


@pytest.fixture
def guarded(sqlite_url: str, tmp_path: Path) -> Iterator[tuple[BrokerProcess, str, str]]:
    """A broker whose API needs a token: (broker, admin token, read token)."""
    file = tmp_path / "tokens"
    admin = add_token(file, "ops", Role.ADMIN)
    read = add_token(file, "viewer", Role.READ)
    with BrokerProcess(sqlite_url, http=True, extra_args=("--token-file", str(file))) as running:
        yield running, admin, read


# The browser logs each refused request itself; the page asked for those.
REFUSED = ("status of 401",)


def test_the_page_asks_for_a_token_once_and_keeps_it_for_the_tab(
    page: Page, guarded: tuple[BrokerProcess, str, str]
) -> None:
    from playwright.sync_api import expect

    broker, admin, _ = guarded
    errors = open_dashboard(page, broker, *REFUSED)
    form = page.locator("#token-form")
    expect(form).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#dashboard")).to_be_hidden()

    page.fill("#token-input", "ops.wrong")
    page.click("#token-form button[type=submit]")
    expect(page.locator("#token-reason")).to_contain_text("refused", timeout=WAIT_MS)
    expect(form).to_be_visible()

    page.fill("#token-input", admin)
    page.click("#token-form button[type=submit]")
    expect(form).to_be_hidden(timeout=WAIT_MS)
    expect(page.locator("#topics-rows")).to_contain_text("sys", timeout=WAIT_MS)
    assert page.evaluate("sessionStorage.getItem('riverbed.token')") == admin

    # Kept for the tab: a reload does not ask again.
    page.reload()
    expect(page.locator("#topics-rows")).to_contain_text("sys", timeout=WAIT_MS)
    rounds(page, 2)
    expect(form).to_be_hidden()
    errors.check()


def test_an_action_a_read_token_may_not_do_is_refused_in_the_page(
    page: Page, guarded: tuple[BrokerProcess, str, str]
) -> None:
    from playwright.sync_api import expect

    broker, _, read = guarded
    client = Client(broker.port, "kept-connected")
    client.connect()
    try:
        errors = open_dashboard(page, broker, *REFUSED, "status of 403")
        page.fill("#token-input", read)
        page.click("#token-form button[type=submit]")
        row = page.locator("#clients-rows tr[data-client-id='kept-connected']")
        expect(row).to_have_count(1, timeout=WAIT_MS)
        row.get_by_role("button", name="Disconnect").click()
        expect(page.locator("#clients-status")).to_contain_text("read role", timeout=WAIT_MS)
        rounds(page, 1)
        assert not client.wait_disconnected(0)
        errors.check()
    finally:
        client.disconnect()
