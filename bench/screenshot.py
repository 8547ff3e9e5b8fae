"""A picture of the dashboard under load: docs/dashboard.png.

Starts `riverbed serve --http` on a SQLite database in a temp dir and gives the
dashboard something to show:

- topic `orders` (4 partitions, bound to `orders/#`), with two publishers
  sending QoS 1 messages to it, each as fast as its PUBACKs come back;
- subscription `billing` delivering `orders` to a local HTTP endpoint that
  refuses the messages whose payload starts with `bad` (HTTP 400): those are
  parked in its dead-letter queue (delivered batch by batch in this process,
  `tests/harness/delivery.py`, before the load starts; no job runs after that,
  so its lag then grows with the load);
- subscription `audit` that nothing consumes (its lag grows too);
- a shared subscription `$share/workers/orders/#` with three members;
- a few idle clients.

Then it opens the dashboard in headless Chromium (the tests' set-up,
`tests/harness/browser.py`), waits until the rates plot covers `--seconds`,
chooses the group and the topic to show their details, and saves the page.

    .venv/bin/python bench/screenshot.py [--seconds 90] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

from harness.broker import BrokerProcess, Client  # noqa: E402
from harness.browser import chromium, missing  # noqa: E402
from harness.delivery import driver  # noqa: E402
from harness.endpoint import Endpoint  # noqa: E402
from harness.waiting import eventually  # noqa: E402
from riverbed import Subscriptions, open_storage  # noqa: E402
from riverbed.subscriptions.definition import (  # noqa: E402
    ConsumptionPolicy,
    DeliveryDefinition,
    HttpEndpoint,
    RetryPolicy,
)
from riverbed.subscriptions.provisioning import create_delivering  # noqa: E402

PUBLISHERS = 2
MEMBERS = 3
IDLE_CLIENTS = 4
PARKED = 6


class Load:
    """Publishers sending QoS 1 messages to `orders/...`, each message once the
    previous one is acknowledged, until `stop`."""

    def __init__(self, port: int) -> None:
        self.clients = [Client(port, f"publisher-{n}") for n in range(PUBLISHERS)]
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(c, n), daemon=True)
            for n, c in enumerate(self.clients)
        ]

    def start(self) -> None:
        for client in self.clients:
            client.connect()
        for thread in self._threads:
            thread.start()

    def _run(self, client: Client, n: int) -> None:
        sent = 0
        while not self._stop.is_set():
            info = client.publish(f"orders/region-{n}", b"order-%d" % sent, key=f"c-{sent % 50}")
            info.wait_for_publish(30)
            sent += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        for client in self.clients:
            client.disconnect()


def prepare(broker: BrokerProcess, endpoint: Endpoint) -> None:
    """The topic, both subscriptions, and `PARKED` messages in billing's DLQ."""
    with httpx.Client(base_url=broker.http_url, timeout=30) as api:
        made = api.post(
            "/api/v1/topics", json={"name": "orders", "partitions": 4, "binding": "orders/#"}
        )
        made.raise_for_status()
    storage = open_storage(broker.db_url)
    try:
        create_delivering(
            storage,
            DeliveryDefinition(
                "billing",
                "orders",
                HttpEndpoint(endpoint.url),
                grouped=False,
                retry=RetryPolicy(retry_on_status=(503,), max_attempts=1),
                # Few at once: the test endpoint's listen queue is short.
                consumption=ConsumptionPolicy(max_in_flight=4, max_parallel_groups=4),
            ),
        )
        Subscriptions(storage).create("audit", "orders")
        endpoint.fail(b"bad", 400)
        first = Client(broker.port, "checkout")
        first.connect()
        for n in range(30):
            payload = b"bad-%d" % n if n % 5 == 0 else b"order-%d" % n
            first.publish("orders/web", payload, key=f"c-{n}").wait_for_publish(30)
        first.disconnect()
        with driver(storage, "billing") as deliveries:
            deliveries.until_idle()
    finally:
        storage.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=90, help="how much the plot covers")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "dashboard.png")
    args = parser.parse_args()
    reason = missing()
    if reason is not None:
        sys.exit(f"error: {reason}")
    data = tempfile.mkdtemp(prefix="riverbed-screenshot-")
    with (
        Endpoint() as endpoint,
        BrokerProcess(f"sqlite:///{data}/riverbed.db", http=True) as broker,
    ):
        prepare(broker, endpoint)
        members = [Client(broker.port, f"worker-{n}") for n in range(MEMBERS)]
        idle = [Client(broker.port, f"sensor-{n:02d}") for n in range(IDLE_CLIENTS)]
        for client in members + idle:
            client.connect()
        for member in members:
            member.subscribe("$share/workers/orders/#", qos=1)
        load = Load(broker.port)
        load.start()
        try:
            with chromium() as browser:
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                page.goto(f"{broker.http_url}/")
                plot = page.locator("#rates-plot")
                points = args.seconds // 2  # one every 2 s
                eventually(
                    lambda: int(plot.get_attribute("data-points") or 0) >= points,
                    timeout=args.seconds * 3,
                    what=f"{points} points on the rates plot",
                    interval=1.0,
                )
                # Details of the group (if this server has shared groups) and the topic.
                group = page.locator("#groups-rows tr.selectable")
                if group.count():
                    group.first.click()
                    page.locator("#group-detail table").first.wait_for()
                page.locator("#topics-rows tr.selectable", has_text="orders").click()
                page.locator("#topic-detail table").wait_for()
                args.out.parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
        finally:
            load.stop()
            for client in members + idle:
                client.disconnect()
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
