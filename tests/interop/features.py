"""The feature list every client of the interop matrix is checked against.

`Features` is a contract suite: a client's module subclasses it as `Test...`
and provides the fixture `make_client(name) -> InteropClient`, a fresh client
of its kind (with the module's protocol version, `version`: 5 or 4 for 3.1.1)
for the broker at `endpoint`. Everything a test checks is done by clients of
that kind, except the publisher of the shared subscription test (a paho-mqtt
client setting ordering keys, so the group's two members both get work).

Where a client cannot do a feature, its module overrides the test with one
that shows why (docs/interop.md says "n/a" there).
"""

from __future__ import annotations

from collections import Counter

import paho.mqtt.client as paho
import pytest

from harness.broker import Client as PahoClient
from harness.waiting import eventually
from interop.clients import NOT_AUTHORISED, Endpoint, InteropClient, MakeClient, Message, Refused
from riverbed.sharedsub.claims import GroupStore
from riverbed.sharedsub.protocol import GroupId
from riverbed.storage import open_storage

SESSION_EXPIRY = 3600
"""Seconds an MQTT 5 persistent session outlives its connection in these tests."""


def wait_payloads(client: InteropClient, *payloads: str) -> list[Message]:
    """Wait until each of `payloads` arrived at `client`; everything it received."""

    def missing() -> list[str]:
        have = {m.payload for m in client.messages()}
        return [p for p in payloads if p not in have]

    eventually(
        lambda: not missing(),
        what=f"{len(payloads)} payload(s) at {client.client_id!r}",
        explain=lambda: f"missing {missing()!r}; received {client.messages()!r}",
    )
    return client.messages()


def wait_disconnected(endpoint: Endpoint, client_id: str) -> None:
    """Until the broker has recorded that `client_id`'s connection is gone."""

    def gone() -> bool:
        record = endpoint.broker.session(client_id)
        return record is not None and not record.connected

    eventually(gone, what=f"the broker to record {client_id!r} disconnected")


def wait_holding(endpoint: Endpoint, text: str, members: int) -> None:
    """Until `members` members of the shared subscription `text` hold streams."""
    group = GroupId.parse(text)

    def holding() -> int:
        storage = open_storage(endpoint.broker.db_url)
        try:
            record = GroupStore(storage).get(group)
        finally:
            storage.close()
        return 0 if record is None else sum(1 for held in record.holdings.values() if held)

    eventually(lambda: holding() >= members, what=f"{members} members of {text} holding streams")


def expiry(version: int) -> int | None:
    """The Session Expiry Interval of a session that outlives its connection
    (MQTT 5; with MQTT 3.1.1 Clean Session 0 alone does that)."""
    return SESSION_EXPIRY if version == 5 else None


class Features:
    """The interop feature list (docs/interop.md), for one client and version."""

    @pytest.mark.parametrize("qos", [0, 1, 2])
    def test_publish_and_subscribe(self, make_client: MakeClient, names: str, qos: int) -> None:
        sub, pub = make_client(f"{names}-sub"), make_client(f"{names}-pub")
        sub.connect()
        assert sub.subscribe(f"{names}/#", qos) == [qos]
        pub.connect()
        pub.publish(f"{names}/a", "first", qos)
        pub.publish(f"{names}/b", "second", qos)
        wait_payloads(sub, "first", "second")
        got = sub.messages()
        assert [(m.topic, m.payload, m.qos, m.retain) for m in got] == [
            (f"{names}/a", "first", qos, False),
            (f"{names}/b", "second", qos, False),
        ]
        pub.disconnect()
        sub.disconnect()

    def test_retained_message_on_subscribe(self, make_client: MakeClient, names: str) -> None:
        pub = make_client(f"{names}-pub")
        pub.connect()
        pub.publish(f"{names}/state", "on", 1, retain=True)
        pub.disconnect()
        sub = make_client(f"{names}-sub")
        sub.connect()
        assert sub.subscribe(f"{names}/#", 1) == [1]
        wait_payloads(sub, "on")
        assert sub.messages() == [Message(f"{names}/state", "on", 1, True)]
        sub.disconnect()

    def test_session_resumed_after_disconnect(
        self, make_client: MakeClient, names: str, endpoint: Endpoint, version: int
    ) -> None:
        sub = make_client(f"{names}-sub")
        assert sub.connect(clean=False, expiry=expiry(version)) in (False, None)
        assert sub.subscribe(f"{names}/#", 1) == [1]
        sub.disconnect()
        wait_disconnected(endpoint, sub.client_id)
        pub = make_client(f"{names}-pub")
        pub.connect()
        pub.publish(f"{names}/a", "while away", 1)
        pub.disconnect()
        assert sub.connect(clean=False, expiry=expiry(version)) in (True, None)
        wait_payloads(sub, "while away")
        sub.disconnect()

    def test_session_resumed_after_broker_restart(
        self, make_client: MakeClient, names: str, endpoint: Endpoint, version: int
    ) -> None:
        sub = make_client(f"{names}-sub")
        sub.connect(clean=False, expiry=expiry(version))
        assert sub.subscribe(f"{names}/#", 1) == [1]
        sub.disconnect()
        wait_disconnected(endpoint, sub.client_id)
        pub = make_client(f"{names}-pub")
        pub.connect()
        pub.publish(f"{names}/a", "before the restart", 1)
        pub.disconnect()
        endpoint.broker.restart()
        pub = make_client(f"{names}-pub2")
        pub.connect()
        pub.publish(f"{names}/a", "after the restart", 1)
        pub.disconnect()
        assert sub.connect(clean=False, expiry=expiry(version)) in (True, None)
        wait_payloads(sub, "before the restart", "after the restart")
        sub.disconnect()

    def test_will_fired_on_abrupt_close(self, make_client: MakeClient, names: str) -> None:
        watcher = make_client(f"{names}-watcher")
        watcher.connect()
        assert watcher.subscribe(f"{names}/will", 1) == [1]
        victim = make_client(f"{names}-victim")
        victim.connect(will=(f"{names}/will", "gone", 1))
        victim.crash()
        wait_payloads(watcher, "gone")
        assert watcher.messages() == [Message(f"{names}/will", "gone", 1, False)]
        watcher.disconnect()

    def test_will_not_fired_on_disconnect(self, make_client: MakeClient, names: str) -> None:
        assert after_disconnect_with_will(make_client, names) == ["marker"]

    def test_shared_subscription_group_of_two(
        self, make_client: MakeClient, names: str, endpoint: Endpoint
    ) -> None:
        shared = f"$share/{names}/{names}/#"
        a, b = make_client(f"{names}-a"), make_client(f"{names}-b")
        for member in (a, b):
            member.connect()
            assert member.subscribe(shared, 1) == [1]
        wait_holding(endpoint, shared, 2)
        # A message's stream follows its ordering key (docs/shared-subscriptions.md):
        # 32 keys reach streams of both members.
        pub = PahoClient(endpoint.port, f"{names}-pub", protocol=paho.MQTTv5)
        pub.connect()
        sent = [f"k{n % 32}:{n}" for n in range(96)]
        infos = [pub.publish(f"{names}/w", p.encode(), 1, key=p.split(":")[0]) for p in sent]
        for info in infos:
            info.wait_for_publish(30)
        wait_union(a, b, sent)
        # Anything delivered twice would come before a marker sent after it on its key.
        markers = [f"k{k}:marker" for k in range(32)]
        infos = [
            pub.publish(f"{names}/w", m.encode(), 1, key=f"k{k}") for k, m in enumerate(markers)
        ]
        for info in infos:
            info.wait_for_publish(30)
        wait_union(a, b, markers)
        counts = Counter(m.payload for member in (a, b) for m in member.messages())
        assert {p for p, n in counts.items() if n > 1} == set()
        assert set(counts) == set(sent) | set(markers)
        assert a.messages() and b.messages(), "one member got everything"
        pub.disconnect()
        a.disconnect()
        b.disconnect()

    def test_username_and_password(
        self, make_client: MakeClient, names: str, endpoint: Endpoint, version: int
    ) -> None:
        with pytest.raises(Refused) as refused:
            make_client(f"{names}-wrong").connect(credentials=(endpoint.username, "wrong"))
        assert refused.value.code == NOT_AUTHORISED[version], refused.value
        sub, pub = make_client(f"{names}-sub"), make_client(f"{names}-pub")
        credentials = (endpoint.username, endpoint.password)
        sub.connect(credentials=credentials)
        assert sub.subscribe(f"{names}/#", 1) == [1]
        pub.connect(credentials=credentials)
        pub.publish(f"{names}/a", "signed in", 1)
        wait_payloads(sub, "signed in")
        pub.disconnect()
        sub.disconnect()

    def test_tls(self, make_client: MakeClient, names: str) -> None:
        sub, pub = make_client(f"{names}-sub"), make_client(f"{names}-pub")
        sub.connect(tls=True)
        assert sub.subscribe(f"{names}/#", 2) == [2]
        pub.connect(tls=True)
        pub.publish(f"{names}/a", "over tls", 2)
        wait_payloads(sub, "over tls")
        assert sub.messages() == [Message(f"{names}/a", "over tls", 2, False)]
        pub.disconnect()
        sub.disconnect()


def after_disconnect_with_will(make_client: MakeClient, names: str) -> list[str]:
    """A client with a Will disconnects normally; what a watcher of its topics
    then receives, up to a marker published after the DISCONNECT (a Will would
    come first)."""
    watcher = make_client(f"{names}-watcher")
    watcher.connect()
    assert watcher.subscribe(f"{names}/#", 1) == [1]
    leaver = make_client(f"{names}-leaver")
    leaver.connect(will=(f"{names}/will", "gone", 1))
    leaver.disconnect()
    marker = make_client(f"{names}-marker")
    marker.connect()
    marker.publish(f"{names}/marker", "marker", 1)
    marker.disconnect()
    wait_payloads(watcher, "marker")
    watcher.disconnect()
    return [m.payload for m in watcher.messages()]


def wait_union(a: InteropClient, b: InteropClient, payloads: list[str]) -> None:
    want = set(payloads)

    def missing() -> list[str]:
        return sorted(want - {m.payload for member in (a, b) for m in member.messages()})

    eventually(
        lambda: not missing(),
        what=f"{len(want)} messages at the group's members",
        explain=lambda: f"missing {missing()[:10]!r}",
    )
