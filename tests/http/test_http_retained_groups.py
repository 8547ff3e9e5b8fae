"""The admin API's retained messages and shared subscription groups, beside a
real `riverbed serve --http` subprocess with paho-mqtt clients, on both backends."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from harness.broker import BrokerProcess, Client
from harness.cli import rb
from harness.sharedsub import short_timers_config
from harness.waiting import eventually
from riverbed.log.topics import BUILTIN_PARTITIONS
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage import open_storage


@pytest.fixture
def broker(storage_url: str, tmp_path: Path) -> Iterator[BrokerProcess]:
    # The Leader stays while the test looks at an idle group.
    config = short_timers_config(tmp_path, leader_idle_stop=30.0)
    with BrokerProcess(storage_url, http=True, extra_args=("--config", str(config))) as running:
        yield running


def retain(port: int, *messages: tuple[str, bytes]) -> None:
    publisher = Client(port, "retainer")
    publisher.connect()
    try:
        for topic, payload in messages:
            publisher.publish(topic, payload, qos=1, retain=True).wait_for_publish(30)
    finally:
        publisher.disconnect()


def test_retained_list_get_and_delete(broker: BrokerProcess, api: httpx.Client) -> None:
    retain(broker.port, ("r/a", b"text a"), ("r/b", b"\xff\x00"), ("s/c", b"other"))

    listed = api.get("/api/v1/retained", params={"filter": "r/#"}).json()
    assert [(m["topic"], m["size"], m["qos"]) for m in listed] == [("r/a", 6, 1), ("r/b", 2, 1)]
    assert all(m["stored_at"].endswith("Z") for m in listed)
    everything = [m["topic"] for m in api.get("/api/v1/retained").json()]
    assert everything == ["r/a", "r/b", "s/c"]
    first = api.get("/api/v1/retained", params={"filter": "+/+", "limit": 1}).json()
    assert [m["topic"] for m in first] == ["r/a"]

    text = api.get("/api/v1/retained/r/a").json()
    assert (text["payload"], text["size"]) == ("text a", 6)
    raw = api.get("/api/v1/retained/r/b").json()
    assert "payload" not in raw
    assert base64.b64decode(raw["payload_b64"]) == b"\xff\x00"

    deleted = api.delete("/api/v1/retained/r/a")
    assert deleted.status_code == 200, deleted.text
    assert deleted.json() == {"topic": "r/a", "deleted": True}
    assert api.get("/api/v1/retained/r/a").status_code == 404
    assert [m["topic"] for m in api.get("/api/v1/retained").json()] == ["r/b", "s/c"]

    # The broker agrees: a new subscriber gets r/b's retained message, and
    # none for r/a (a live marker after r/b shows nothing more was coming).
    subscriber = Client(broker.port, "late")
    subscriber.connect()
    try:
        subscriber.subscribe("r/#", qos=1)
        subscriber.wait_payloads(b"\xff\x00")
        marker = Client(broker.port, "marker")
        marker.connect()
        marker.publish("r/z", b"marker", qos=1).wait_for_publish(30)
        marker.disconnect()
        received = subscriber.wait_payloads(b"marker")
        assert [(m.topic, m.payload) for m in received] == [
            ("r/b", b"\xff\x00"),
            ("r/z", b"marker"),
        ]
    finally:
        subscriber.disconnect()


def test_retained_404_and_bad_input_422_change_nothing(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    retain(broker.port, ("kept/t", b"x"))
    for method in ("GET", "DELETE"):
        missing = api.request(method, "/api/v1/retained/none/here")
        assert missing.status_code == 404, missing.text
        assert "none/here" in missing.json()["error"]
    for params, words in [
        ({"filter": "a/#/b"}, "filter"),
        ({"filter": "a+"}, "filter"),
        ({"limit": 0}, "limit"),
        ({"limit": "many"}, "limit"),
    ]:
        refused = api.get("/api/v1/retained", params=params)
        assert refused.status_code == 422, (params, refused.text)
        assert words in refused.json()["error"]
    wildcard = api.delete("/api/v1/retained/kept/%23")
    assert wildcard.status_code == 422, wildcard.text
    assert "topic" in wildcard.json()["error"] and "wildcard" in wildcard.json()["error"]
    assert [m["topic"] for m in api.get("/api/v1/retained").json()] == ["kept/t"]


def _holdings(url: str, group: GroupId) -> dict[str, tuple[object, ...]]:
    storage = open_storage(url)
    try:
        record = GroupStore(storage).get(group)
    finally:
        storage.close()
    return {} if record is None else dict(record.holdings)


def _balanced(holdings: dict[str, tuple[object, ...]]) -> bool:
    """Two holders, holding every stream of `mqtt` between them, half each."""
    held = sorted(len(streams) for streams in holdings.values() if streams)
    return held == [BUILTIN_PARTITIONS // 2, BUILTIN_PARTITIONS // 2]


def test_groups_show_leader_members_and_holders_as_the_cli_does(
    broker: BrokerProcess, api: httpx.Client
) -> None:
    node = api.get("/api/v1/node").json()["node"]
    started = time.time()
    group = GroupId("g", "w/#")
    members = [Client(broker.port, name) for name in ("member-a", "member-b")]
    try:
        for member in members:
            member.connect()
            assert member.subscribe("$share/g/w/#", qos=1) == [1]
        # Settled: the second member's streams taken from the first and granted
        # (while they move, the Leader's view and the stored one may differ).
        eventually(
            lambda: _balanced(_holdings(broker.db_url, group)),
            what="both members holding half of the streams",
        )

        (summary,) = api.get("/api/v1/groups").json()
        assert (summary["id"], summary["name"], summary["filter"]) == ("g/w/#", "g", "w/#")
        assert summary["members"] == 2
        leader = summary["leader"]
        assert leader["node"] == node
        since = datetime.strptime(leader["since"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        assert started - 1 <= since <= time.time() + 1

        described = api.get("/api/v1/groups/g/w/%23")
        assert described.status_code == 200, described.text
        view = described.json()
        assert {m["client_id"] for m in view["members"]} == {"member-a", "member-b"}
        assert {m["node"] for m in view["members"]} == {node}
        # Each stream's holder is the member that lists it.
        held = {s: m["member"] for m in view["members"] for s in m["streams"]}
        assert held
        for stream in view["streams"]:
            assert stream["holder"] == held.get(stream["stream"])

        # The command line reads the same: one reading, two views.
        cli = rb(broker.db_url, "group", "describe", "g", "w/#", "--json")
        assert cli.exit_code == 0, cli.output
        shown = json.loads(cli.output)
        assert shown["leader"] == leader["id"]
        assert {b: s for b, s in shown["borrowers"].items()} == {
            m["member"]: m["streams"] for m in view["members"]
        }
        assert [s["stream"] for s in shown["streams"]] == [s["stream"] for s in view["streams"]]
    finally:
        for member in members:
            member.disconnect()


def test_missing_group_is_404_and_a_bad_name_422(api: httpx.Client) -> None:
    missing = api.get("/api/v1/groups/nobody/w/%23")
    assert missing.status_code == 404, missing.text
    assert "nobody" in missing.json()["error"]
    bad = api.get("/api/v1/groups/bad+name/w")
    assert bad.status_code == 422, bad.text
    assert "bad+name" in bad.json()["error"]
    bad_filter = api.get("/api/v1/groups/g/w/%23/x")
    assert bad_filter.status_code == 422, bad_filter.text
    assert "w/#/x" in bad_filter.json()["error"]
    assert api.get("/api/v1/groups").json() == []
