"""The admin API's clients, sessions and nodes, beside a real `riverbed serve
--http` subprocess, with real MQTT clients, on both backends."""

from __future__ import annotations

import re
import time
from datetime import datetime
from pathlib import Path

import httpx
from click.testing import CliRunner

from harness.admin_api import AdminApi
from harness.broker import BrokerProcess, Client
from harness.raw_mqtt import RawClient
from harness.waiting import eventually
from riverbed import __version__
from riverbed.cli import cli
from riverbed.clock import now_us
from riverbed.mqtt.codec import Puback, Publish, Suback, Subscribe, SubscribeTopic
from riverbed.mqtt.retained import RetainedStore
from riverbed.sessions.session import Subscription
from riverbed.sessions.store import SessionRecord, SessionStore, node_lease
from riverbed.storage import open_storage
from riverbed.storage.leases import Leases


def parse_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


def test_clients_show_in_flight_connect_time_and_node_and_filter_by_q(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    node = api.get("/api/v1/node").json()["node"]
    before = time.time()
    publisher = Client(broker.port, "pub-1")
    publisher.connect()
    try:
        with RawClient(broker.port) as slow:
            slow.connect("slow-reader", clean=True)
            slow.send(Subscribe(1, (SubscribeTopic("inflight/#", 1),)))
            slow.expect(Suback)
            for n in range(3):
                publisher.publish("inflight/x", b"%d" % n, qos=1).wait_for_publish(30)
            sent = [slow.expect(Publish) for _ in range(3)]  # never acknowledged

            def slow_reader() -> dict[str, object] | None:
                found = api.get("/api/v1/clients", params={"q": "SLOW"}).json()
                return found[0] if found and found[0]["in_flight"] == 3 else None

            view = eventually(slow_reader, what="slow-reader with 3 in flight")
            assert view["client_id"] == "slow-reader"
            assert view["node"] == node
            assert view["protocol"] == "5"
            assert re.fullmatch(r"127\.0\.0\.1:\d+", str(view["peer"])), view["peer"]
            assert before - 1 <= parse_time(str(view["connected_since"])) <= time.time() + 1
            # `q` matched the client id only: the publisher is not listed.
            listed = api.get("/api/v1/clients", params={"q": "SLOW"}).json()
            assert [c["client_id"] for c in listed] == ["slow-reader"]
            everyone = {c["client_id"] for c in api.get("/api/v1/clients").json()}
            assert everyone == {"slow-reader", "pub-1"}
            # The peer matches too (both are on 127.0.0.1).
            by_peer = {
                c["client_id"] for c in api.get("/api/v1/clients", params={"q": "127.0"}).json()
            }
            assert by_peer == everyone

            slow.send(Puback(sent[0].packet_id or 0))
            eventually(
                lambda: (
                    api.get("/api/v1/clients", params={"q": "slow"}).json()[0]["in_flight"] == 2
                ),
                what="one PUBACK taken off in_flight",
            )
    finally:
        publisher.disconnect()


def test_offline_persistent_session_is_listed_and_deleted(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    made = api.post("/api/v1/topics", json={"name": "dev", "partitions": 1, "binding": "dev/#"})
    assert made.status_code == 201, made.text
    node = api.get("/api/v1/node").json()["node"]
    keeper = Client(broker.port, "keeper")
    keeper.connect(clean=False, expiry=3600)
    keeper.subscribe("dev/#", qos=1)
    online = api.get("/api/v1/sessions", params={"online": "true"}).json()
    assert [(s["client_id"], s["online"], s["node"]) for s in online] == [("keeper", True, node)]
    keeper.disconnect()
    eventually(
        lambda: (s := broker.session("keeper")) is not None and not s.connected,
        what="keeper's session saved as disconnected",
    )

    publisher = Client(broker.port, "dev-pub")
    publisher.connect()
    for n in range(3):
        publisher.publish("dev/x", b"%d" % n, qos=1).wait_for_publish(30)
    publisher.disconnect()

    listed = api.get("/api/v1/sessions", params={"online": "false"}).json()
    (view,) = [s for s in listed if s["client_id"] == "keeper"]
    assert view["online"] is False and view["node"] is None
    assert view["expiry_seconds"] == 3600
    assert parse_time(view["expires_at"]) > time.time() + 3000
    assert view["subscriptions"] == 1
    assert view["backlog"] is None  # costly for a list
    assert api.get("/api/v1/sessions", params={"online": "true", "q": "keep"}).json() == []
    assert [s["client_id"] for s in api.get("/api/v1/sessions", params={"q": "KEEP"}).json()] == [
        "keeper"
    ]

    one = api.get("/api/v1/sessions/keeper").json()
    assert one["online"] is False
    assert one["subscriptions"] == [
        {
            "filter": "dev/#",
            "qos": 1,
            "no_local": False,
            "retain_as_published": False,
            "retain_handling": 0,
            "identifier": None,
        }
    ]
    # The topic `dev` stores only what `dev/#` matches: the count is exact.
    assert (one["backlog"], one["backlog_exact"]) == (3, True)

    deleted = api.delete("/api/v1/sessions/keeper")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"client_id": "keeper", "deleted": True}
    assert broker.session("keeper") is None
    assert api.get("/api/v1/sessions/keeper").status_code == 404
    assert "keeper" not in [s["client_id"] for s in api.get("/api/v1/sessions").json()]
    # Resuming finds no session, and so none of what it was owed.
    again = Client(broker.port, "keeper")
    assert again.connect(clean=False, expiry=3600) is False
    again.subscribe("dev/#", qos=1)
    marker = Client(broker.port, "dev-marker")
    marker.connect()
    marker.publish("dev/x", b"marker", qos=1).wait_for_publish(30)
    marker.disconnect()
    again.wait_payloads(b"marker")
    assert again.payloads() == [b"marker"]
    again.disconnect()


def test_a_session_not_stored_yet_is_shown_online_and_deleted(
    broker: BrokerProcess, api: httpx.Client, storage_url: str
) -> None:
    """On SQLite a session that ends with its connection and has nothing to
    store yet is kept in the broker's memory (`Broker.defers_ephemeral`): the
    API shows it from there, as it shows a stored one, and deleting it
    disconnects it and leaves nothing stored."""
    node = api.get("/api/v1/node").json()["node"]
    with RawClient(broker.port) as client:
        assert not client.connect("fresh", clean=True, expiry=0).session_present
        assert (broker.session("fresh") is None) is storage_url.startswith("sqlite")
        listed = api.get("/api/v1/sessions", params={"online": "true", "q": "fresh"}).json()
        assert [(s["client_id"], s["node"], s["expiry_seconds"]) for s in listed] == [
            ("fresh", node, 0)
        ]
        one = api.get("/api/v1/sessions/fresh").json()
        assert one["online"] is True and one["subscriptions"] == []
        assert (one["backlog"], one["backlog_exact"]) == (0, True)
        deleted = api.delete("/api/v1/sessions/fresh")
        assert deleted.status_code == 200, deleted.text
    assert broker.session("fresh") is None
    assert api.get("/api/v1/sessions/fresh").status_code == 404


def test_deleting_a_session_connected_here_disconnects_it_first(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    watcher = Client(broker.port, "will-watcher")
    watcher.connect()
    watcher.subscribe("wills/#", qos=1)
    live = Client(broker.port, "live-1")
    # A Will delayed for longer than any test: it goes when the session ends.
    live.connect(clean=False, expiry=600, will=("wills/live-1", b"gone", 1, False), will_delay=500)
    live.subscribe("live/#", qos=1)
    try:
        deleted = api.delete("/api/v1/sessions/live-1")
        assert deleted.status_code == 200, deleted.text
        assert live.wait_disconnected(30)
        assert live.disconnects == [0x98]
        assert broker.session("live-1") is None
        assert api.get("/api/v1/sessions/live-1").status_code == 404
        assert [c for c in api.get("/api/v1/clients").json() if c["client_id"] == "live-1"] == []
        # The session ended: its Will went at once [MQTT-3.1.3-9].
        watcher.wait_payloads(b"gone")
    finally:
        live.close()
        watcher.disconnect()


def _held_elsewhere(url: str, client_id: str, node: str, *, alive: bool) -> None:
    """A session record marked connected on `node`, whose liveness lease runs
    for ten minutes (`alive`) or lapsed a second ago."""
    storage = open_storage(url)
    try:
        at = now_us()
        taken = at if alive else at - 2_000_000
        ttl = 600_000_000 if alive else 1_000_000
        Leases(storage).acquire(node_lease(node), node, ttl, taken)
        record = SessionRecord(
            client_id,
            "s" * 32,
            5,
            600,
            True,
            at,
            subscriptions=(Subscription("far/#", 1),),
            node=node,
        )
        SessionStore(storage).write(record, None)
    finally:
        storage.close()


def test_a_session_connected_to_another_node_is_not_deleted_409(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    _held_elsewhere(broker.db_url, "far-away", "node-elsewhere", alive=True)
    view = api.get("/api/v1/sessions/far-away").json()
    assert (view["online"], view["node"]) == (True, "node-elsewhere")
    assert view["expires_at"] is None  # in use: it does not expire
    refused = api.delete("/api/v1/sessions/far-away")
    assert refused.status_code == 409, refused.text
    assert "node-elsewhere" in refused.json()["error"]
    assert broker.session("far-away") is not None


def test_a_session_left_connected_by_a_lapsed_node_is_offline_and_deletable(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    _held_elsewhere(broker.db_url, "orphan", "node-crashed", alive=False)
    view = api.get("/api/v1/sessions/orphan").json()
    assert (view["online"], view["node"]) == (False, None)
    assert view["expires_at"] is not None
    assert api.delete("/api/v1/sessions/orphan").status_code == 200
    assert broker.session("orphan") is None


def test_nodes_are_the_broker_node_leases_alive_or_lapsed(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    node = api.get("/api/v1/node").json()["node"]
    _held_elsewhere(broker.db_url, "orphan", "node-crashed", alive=False)
    nodes = {n["node"]: n for n in api.get("/api/v1/nodes").json()}
    assert set(nodes) == {node, "node-crashed"}
    here = nodes[node]
    assert (here["alive"], here["here"], here["owner"]) == (True, True, node)
    assert parse_time(here["expires_at"]) > time.time()
    # What the node says about itself (the node directory).
    assert f"mqtt://127.0.0.1:{broker.port}" in here["addresses"]
    assert broker.process is not None and here["pid"] == broker.process.pid
    assert parse_time(here["started_at"]) <= time.time()
    assert isinstance(here["connections"], int) and here["connections"] >= 0
    assert (here["leaders"], here["version"]) == (0, __version__)
    crashed = nodes["node-crashed"]
    assert (crashed["alive"], crashed["here"], crashed["sessions"]) == (False, False, 1)
    assert parse_time(crashed["expires_at"]) < time.time()
    assert (crashed["addresses"], crashed["connections"], crashed["pid"]) == ([], None, None)


def test_missing_sessions_are_404_and_bad_input_is_422(api: httpx.Client) -> None:
    for method, path in [
        ("GET", "/api/v1/sessions/nobody"),
        ("DELETE", "/api/v1/sessions/nobody"),
        ("DELETE", "/api/v1/clients/nobody"),
    ]:
        missing = api.request(method, path)
        assert missing.status_code == 404, (method, path, missing.text)
        assert "nobody" in missing.json()["error"]
    bad = api.get("/api/v1/sessions", params={"online": "perhaps"})
    assert bad.status_code == 422
    assert "online" in bad.json()["error"]


def test_a_read_token_may_look_but_not_delete(storage_url: str, tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    keys = {}
    for name, role in (("ops", "admin"), ("viewer", "read")):
        added = CliRunner().invoke(cli, ["token", "add", str(tokens), name, "--role", role])
        assert added.exit_code == 0, added.output
        keys[name] = added.stdout.strip()
    with BrokerProcess(storage_url, http=True, extra_args=("--token-file", str(tokens))) as broker:
        keeper = Client(broker.port, "guarded")
        keeper.connect(clean=False, expiry=600)
        keeper.publish("guarded/t", b"kept", qos=1, retain=True).wait_for_publish(30)
        try:
            with httpx.Client(
                base_url=broker.http_url,
                timeout=30,
                headers={"Authorization": f"Bearer {keys['viewer']}"},
            ) as viewer:
                for path in (
                    "/sessions",
                    "/sessions/guarded",
                    "/retained/guarded/t",
                    "/groups",
                    "/nodes",
                    "/clients",
                ):
                    looked = viewer.get(f"/api/v1{path}")
                    assert looked.status_code == 200, (path, looked.text)
                for path in ("/sessions/guarded", "/retained/guarded/t", "/clients/guarded"):
                    refused = viewer.delete(f"/api/v1{path}")
                    assert refused.status_code == 403, (path, refused.text)
                    assert "read role" in refused.json()["error"]
                # Nothing changed.
                assert viewer.get("/api/v1/sessions/guarded").json()["online"] is True
                assert viewer.get("/api/v1/retained/guarded/t").json()["payload"] == "kept"
            with httpx.Client(
                base_url=broker.http_url,
                timeout=30,
                headers={"Authorization": f"Bearer {keys['ops']}"},
            ) as ops:
                assert ops.delete("/api/v1/retained/guarded/t").status_code == 200
                assert ops.delete("/api/v1/sessions/guarded").status_code == 200
            assert keeper.wait_disconnected(30)
        finally:
            keeper.close()


def test_admin_without_a_broker_lists_and_deletes_stored_sessions_and_retained(
    storage_url: str, tmp_path: Path
) -> None:
    """`riverbed admin` has no MQTT listener: no clients, but the stored
    sessions and retained messages are the database's, and deleting them works."""
    with BrokerProcess(storage_url) as broker:
        keeper = Client(broker.port, "stored-1")
        keeper.connect(clean=False, expiry=600)
        keeper.subscribe("st/#", qos=1)
        keeper.publish("st/r", b"retained", qos=1, retain=True).wait_for_publish(30)
        keeper.disconnect()
        eventually(
            lambda: (s := broker.session("stored-1")) is not None and not s.connected,
            what="stored-1's session saved as disconnected",
        )
    with AdminApi(storage_url) as admin, admin.client() as api:
        assert api.get("/api/v1/clients").json() == []
        (view,) = api.get("/api/v1/sessions").json()
        assert (view["client_id"], view["online"]) == ("stored-1", False)
        # The broker stopped cleanly: it released its lease.
        assert api.get("/api/v1/nodes").json() == []
        assert api.delete("/api/v1/retained/st/r").status_code == 200
        assert api.delete("/api/v1/sessions/stored-1").status_code == 200
        assert api.get("/api/v1/sessions").json() == []
        assert api.get("/api/v1/retained").json() == []
    storage = open_storage(storage_url)
    try:
        assert SessionStore(storage).load("stored-1") is None
        assert RetainedStore(storage).get("st/r") is None
    finally:
        storage.close()


def test_openapi_lists_the_mqtt_endpoints_with_their_errors(api: httpx.Client) -> None:
    paths = api.get("/api/v1/openapi.json").json()["paths"]
    for path, method, errors in [
        ("/api/v1/clients", "get", ()),
        ("/api/v1/clients/{client_id}", "delete", ("404",)),
        ("/api/v1/sessions", "get", ()),
        ("/api/v1/sessions/{client_id}", "get", ("404",)),
        ("/api/v1/sessions/{client_id}", "delete", ("404", "409")),
        ("/api/v1/retained", "get", ("422",)),
        ("/api/v1/retained/{topic}", "get", ("404", "422")),
        ("/api/v1/retained/{topic}", "delete", ("404", "422")),
        ("/api/v1/groups", "get", ()),
        ("/api/v1/groups/{group}/{topic_filter}", "get", ("404", "422")),
        ("/api/v1/nodes", "get", ()),
    ]:
        operation = paths.get(path, {}).get(method)
        assert operation is not None, (path, method, sorted(paths))
        assert operation["tags"] and operation["summary"], (path, method)
        assert set(errors) <= set(operation["responses"]), (path, method, operation["responses"])
