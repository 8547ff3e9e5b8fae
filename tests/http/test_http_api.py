"""The admin HTTP API of a real `riverbed serve --http` subprocess, over real HTTP."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator

import httpx
import pytest

from harness.broker import BrokerProcess, Client
from harness.cli import rb
from harness.databases import BACKENDS, fresh_database
from harness.waiting import eventually
from riverbed.http.topics import MAX_MESSAGE_BODY
from riverbed.storage import redact_url

ORDERS = {"name": "orders", "partitions": 4, "binding": "orders/#", "retention": "12h"}


def test_health_and_readiness_answer_without_a_token(api: httpx.Client) -> None:
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json() == {"status": "ready"}


def test_node_shows_version_uptime_and_config_without_secrets(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    node = api.get("/api/v1/node").json()
    assert node["version"]
    assert node["uptime_seconds"] >= 0
    assert node["config"]["listeners"]["mqtt"] == f"127.0.0.1:{broker.port}"
    assert node["config"]["http"]["address"] == f"127.0.0.1:{broker.http_port}"
    assert node["config"]["storage"]["url"] == redact_url(broker.db_url)


def test_topics_create_describe_list_delete(broker: BrokerProcess, api: httpx.Client) -> None:
    created = api.post("/api/v1/topics", json=ORDERS)
    assert created.status_code == 201, created.text
    assert created.json()["binding"] == "orders/#"
    assert created.json()["retention"] == "12h"
    # The CLI sees what the API made: one implementation.
    listed = rb(broker.db_url, "topic", "describe", "orders", "--json")
    assert '"binding": "orders/#"' in listed.output

    described = api.get("/api/v1/topics/orders").json()
    assert [s["partitions"] for s in described["storage_topics"]] == [4]
    assert len(described["streams"]) == 4
    names = [t["name"] for t in api.get("/api/v1/topics").json()]
    assert "orders" in names

    again = api.post("/api/v1/topics", json=ORDERS)
    assert again.status_code == 409
    assert "orders" in again.json()["error"]

    deleted = api.delete("/api/v1/topics/orders")
    assert deleted.status_code == 200, deleted.text
    assert api.get("/api/v1/topics/orders").status_code == 404
    assert "orders" not in [t["name"] for t in api.get("/api/v1/topics").json()]


@pytest.fixture(scope="module", params=BACKENDS)
def unchanged(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[httpx.Client]:
    """A refusal changes nothing, so the refusal tests' cases share one broker
    (per backend) with topic `orders` and no message; each case checks that
    nothing changed."""
    with contextlib.ExitStack() as stack:
        url = fresh_database(request, tmp_path_factory, stack, "http-api")
        broker = stack.enter_context(BrokerProcess(url, http=True))
        client = stack.enter_context(httpx.Client(base_url=broker.http_url, timeout=30))
        assert client.post("/api/v1/topics", json=ORDERS).status_code == 201
        yield client


def nothing_changed(api: httpx.Client) -> None:
    topics = {t["name"]: t for t in api.get("/api/v1/topics").json()}
    assert set(topics) - {"mqtt", "sys"} == {"orders"}, topics
    assert topics["orders"]["messages"] == 0


REFUSED = {**ORDERS, "name": "refused", "binding": "refused/#"}


@pytest.mark.parametrize(
    ("body", "field", "rule"),
    [
        ({**REFUSED, "partitions": 5}, "", "partition"),
        ({**REFUSED, "partitions": "many"}, "partitions", "integer"),
        ({**REFUSED, "retention": "soon"}, "retention", "soon"),
        ({**REFUSED, "key": "sideways"}, "key", "sideways"),
        ({**REFUSED, "colour": "blue"}, "colour", "Extra inputs"),
        ({**REFUSED, "binding": "refused/#/x"}, "", "refused/#/x"),
    ],
)
def test_bad_topic_is_refused_naming_field_and_rule_and_nothing_is_created(
    unchanged: httpx.Client, body: dict[str, object], field: str, rule: str
) -> None:
    refused = unchanged.post("/api/v1/topics", json=body)
    assert refused.status_code == 422, refused.text
    error = refused.json()["error"]
    assert field in error and rule in error, error
    assert unchanged.get("/api/v1/topics/refused").status_code == 404
    nothing_changed(unchanged)


def test_produce_reaches_an_mqtt_subscriber(broker: BrokerProcess, api: httpx.Client) -> None:
    assert api.post("/api/v1/topics", json=ORDERS).status_code == 201
    subscriber = Client(broker.port, "http-sub")
    subscriber.connect()
    subscriber.subscribe("orders/#", qos=1)
    try:
        text = api.post(
            "/api/v1/topics/orders/messages",
            json={"payload": "from http", "mqtt_topic": "orders/eu", "key": "k1"},
        )
        assert text.status_code == 201, text.text
        assert text.json()["stream"].startswith("orders/0/")
        raw = api.post(
            "/api/v1/topics/orders/messages",
            json={"payload_b64": base64.b64encode(b"\x00\xff").decode(), "mqtt_topic": "orders/us"},
        )
        assert raw.status_code == 201, raw.text
        received = subscriber.wait_payloads(b"from http", b"\x00\xff")
        assert {m.topic for m in received} == {"orders/eu", "orders/us"}
    finally:
        subscriber.disconnect()
    # Committed before the 201: the topic counts both.
    summary = next(t for t in api.get("/api/v1/topics").json() if t["name"] == "orders")
    assert summary["messages"] == 2


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"mqtt_topic": "orders/eu"}, "payload"),
        ({"payload": "x", "payload_b64": "eA=="}, "not both"),
        ({"payload_b64": "***"}, "base64"),
        ({"payload": "x", "mqtt_topic": "elsewhere"}, "binding"),
        ({"payload": "x", "qos": 7}, "qos"),
    ],
)
def test_bad_message_is_refused_and_nothing_is_written(
    unchanged: httpx.Client, body: dict[str, object], words: str
) -> None:
    refused = unchanged.post("/api/v1/topics/orders/messages", json=body)
    assert refused.status_code == 422, refused.text
    assert words in refused.json()["error"]
    nothing_changed(unchanged)


def test_a_body_over_the_limit_is_413_and_nothing_is_written(api: httpx.Client) -> None:
    assert api.post("/api/v1/topics", json=ORDERS).status_code == 201
    huge = {"payload": "x" * (MAX_MESSAGE_BODY + 1)}
    refused = api.post("/api/v1/topics/orders/messages", json=huge)
    assert refused.status_code == 413
    assert str(MAX_MESSAGE_BODY) in refused.json()["error"]
    summary = next(t for t in api.get("/api/v1/topics").json() if t["name"] == "orders")
    assert summary["messages"] == 0


def test_produce_to_a_missing_topic_is_404(api: httpx.Client) -> None:
    missing = api.post("/api/v1/topics/nowhere/messages", json={"payload": "x"})
    assert missing.status_code == 404
    assert "nowhere" in missing.json()["error"]


def test_subscriptions_with_lag(broker: BrokerProcess, api: httpx.Client) -> None:
    assert api.post("/api/v1/topics", json={**ORDERS, "partitions": 1}).status_code == 201
    made = rb(broker.db_url, "subscription", "create", "billing", "--topic", "orders")
    assert made.exit_code == 0, made.output
    for n in range(3):
        posted = api.post("/api/v1/topics/orders/messages", json={"payload": f"m{n}"})
        assert posted.status_code == 201
    one = api.get("/api/v1/subscriptions/billing").json()
    assert one["topic"] == "orders"
    assert one["lag"] == 3
    assert [s["lag"] for s in one["streams"]] == [3]
    listed = api.get("/api/v1/subscriptions").json()
    assert [(s["name"], s["lag"]) for s in listed if s["name"] == "billing"] == [("billing", 3)]
    assert api.get("/api/v1/subscriptions/nobody").status_code == 404


def test_clients_are_listed_and_one_can_be_disconnected(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    client = Client(broker.port, "dev-1")
    client.connect()
    try:
        listed = eventually(
            lambda: [c for c in api.get("/api/v1/clients").json() if c["client_id"] == "dev-1"],
            what="dev-1 in /api/v1/clients",
        )
        assert listed[0]["protocol"] == "5"
        gone = api.delete("/api/v1/clients/dev-1")
        assert gone.status_code == 200, gone.text
        assert client.wait_disconnected(30)
        assert client.disconnects == [0x98]
        # Gone from the list once its session is saved; then nothing to disconnect.
        eventually(
            lambda: api.delete("/api/v1/clients/dev-1").status_code == 404,
            what="dev-1 gone from the broker's connections",
        )
    finally:
        client.close()


def test_openapi_lists_the_endpoints(api: httpx.Client) -> None:
    document = api.get("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    paths = document["paths"]
    for path, method in [
        ("/api/v1/node", "get"),
        ("/api/v1/topics", "get"),
        ("/api/v1/topics", "post"),
        ("/api/v1/topics/{name}", "get"),
        ("/api/v1/topics/{name}", "delete"),
        ("/api/v1/topics/{name}/messages", "post"),
        ("/api/v1/subscriptions", "get"),
        ("/api/v1/subscriptions/{name}", "get"),
        ("/api/v1/clients", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
    ]:
        assert method in paths.get(path, {}), (path, method)
    produce = paths["/api/v1/topics/{name}/messages"]["post"]["requestBody"]
    schema = produce["content"]["application/json"]["schema"]
    assert "payload_b64" in schema["properties"]


def test_unknown_path_is_a_json_404(api: httpx.Client) -> None:
    missing = api.get("/api/v1/nothing-here")
    assert missing.status_code == 404
    assert "error" in missing.json()


def test_metrics_count_what_the_broker_did(broker: BrokerProcess, api: httpx.Client) -> None:
    """`/metrics` serves the broker's own counters (`riverbed.metrics`), in a
    form prometheus-client's parser reads."""
    from prometheus_client.parser import text_string_to_metric_families

    publisher = Client(broker.port, "metrics-pub")
    publisher.connect()
    try:
        for n in range(5):
            publisher.publish("m/x", b"%d" % n, qos=1)

        def published() -> dict[str, float]:
            reply = api.get("/metrics")
            assert reply.status_code == 200, reply.text
            assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
            samples = {}
            for family in text_string_to_metric_families(reply.text):
                for sample in family.samples:
                    samples[sample.name + str(sorted(sample.labels.items()))] = sample.value
            return samples

        samples = eventually(
            lambda: (
                (s := published()).get("riverbed_publish_received_total[('qos', '1')]", 0) >= 5
                and s
            ),
            what="5 QoS 1 PUBLISHes counted",
            explain=published,
        )
        assert samples["riverbed_connections_current[]"] >= 1
    finally:
        publisher.disconnect()
