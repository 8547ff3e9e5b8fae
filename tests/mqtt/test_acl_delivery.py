"""The ACL's read rule end to end: paho-mqtt clients against `riverbed serve`
with an ACL file that denies `subscribe` on `secrets/#` and allows the rest.

In the default `auth.acl_wildcard = "filter"` a wildcard subscription that
reaches secrets is granted, and every message of a secret topic is withheld on
its way out: live, queued while the session was offline, retained, and to a
`$share` group. Withheld QoS 1 messages take no place in the in-flight window
(the broker's is 4 here) and do not hold the cursor back. `strict` refuses
such a subscription; a session granted one before the ACL changed still gets
no secret. Every message of a test carries the same ordering key, so all of
them are on one stream, in order: the marker published last arrives last, and
once it is in, nothing before it is still on its way.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import paho.mqtt.client as paho
import pytest

from harness.broker import BrokerProcess, Client, Received
from harness.sharedsub import SHORT_TIMERS

RIVERBED = str(Path(sys.executable).with_name("riverbed"))
DENY_SECRETS = "deny subscribe anyone secrets/#\ndefault allow\n"
MAX_INFLIGHT = 4
GRANTED_QOS_1 = 1
NOT_AUTHORIZED = 0x87
FAILURE_V311 = 0x80
PROTOCOLS = [pytest.param(paho.MQTTv5, id="mqtt5"), pytest.param(paho.MQTTv311, id="mqtt311")]


def configure(directory: Path, acl: str, wildcard: str = "filter") -> Path:
    """Write the ACL file and `riverbed.toml` beside it; the config's path."""
    (directory / "acl").write_text(acl)
    config = directory / "riverbed.toml"
    config.write_text(
        f'[auth]\nacl_file = "acl"\nacl_wildcard = "{wildcard}"\n'
        f"[limits]\nmax_inflight = {MAX_INFLIGHT}\n{SHORT_TIMERS}"
    )
    return config


@pytest.fixture
def broker(tmp_path: Path, sqlite_url: str) -> Iterator[BrokerProcess]:
    config = configure(tmp_path, DENY_SECRETS)
    with BrokerProcess(sqlite_url, extra_args=("--config", str(config))) as running:
        yield running


def publish(port: int, messages: list[tuple[str, bytes]], retain: bool = False) -> None:
    """Publish at QoS 1 with one ordering key (one stream, in order); wait for
    every PUBACK."""
    pub = Client(port, "publisher")
    pub.connect()
    infos = [pub.publish(topic, payload, retain=retain, key="one") for topic, payload in messages]
    for info in infos:
        info.wait_for_publish(30)
    pub.disconnect()


def mixed(tag: str, secrets: int = 3 * MAX_INFLIGHT) -> list[tuple[str, bytes]]:
    """More secret messages than the window holds, public ones among them, a marker last."""
    out = [(f"secrets/{tag}/{n}", b"secret %s %d" % (tag.encode(), n)) for n in range(secrets)]
    out.insert(secrets // 2, (f"public/{tag}/1", b"public %s 1" % tag.encode()))
    out.append((f"public/{tag}/2", b"public %s 2" % tag.encode()))
    out.append(("marker", b"marker " + tag.encode()))
    return out


def public(messages: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(t, p) for t, p in messages if not t.startswith("secrets/")]


def got(received: list[Received]) -> list[tuple[str, bytes]]:
    return [(m.topic, m.payload) for m in received]


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_hash_is_granted_and_secret_messages_are_withheld_live(
    broker: BrokerProcess, protocol: int
) -> None:
    sub = Client(broker.port, "reader", protocol=protocol)
    sub.connect()
    assert sub.subscribe("#", "+/+/+") == [GRANTED_QOS_1, GRANTED_QOS_1]
    refused = NOT_AUTHORIZED if protocol == paho.MQTTv5 else FAILURE_V311
    assert sub.subscribe("secrets/#", "secrets/live/1") == [refused, refused]
    messages = mixed("live")
    publish(broker.port, messages)
    sub.wait_payloads(b"marker live")
    assert got(sub.received_now()) == public(messages)
    sub.disconnect()


def test_the_window_and_the_cursor_move_past_withheld_messages(broker: BrokerProcess) -> None:
    """Three windows' worth of withheld QoS 1 messages, then an allowed one: it
    arrives; resumed, the session gets nothing again (its cursor passed them
    all), and the offline queue's secrets are withheld too."""
    sub = Client(broker.port, "reader")
    sub.connect(clean=False, expiry=600)
    assert sub.subscribe("#") == [GRANTED_QOS_1]
    online = mixed("online")
    publish(broker.port, online)
    sub.wait_payloads(b"marker online")
    assert got(sub.received_now()) == public(online)
    sub.disconnect()

    offline = mixed("offline")
    publish(broker.port, offline)
    again = Client(broker.port, "reader")
    assert again.connect(clean=False, expiry=600) is True
    again.wait_payloads(b"marker offline")
    assert got(again.received_now()) == public(offline)  # nothing of before: no replay
    assert not any(m.dup for m in again.received_now())
    again.disconnect()


def test_retained_messages_obey_the_read_rule(broker: BrokerProcess) -> None:
    publish(
        broker.port,
        [("secrets/r", b"secret r"), ("public/r", b"public r"), ("zz/marker", b"marker")],
        retain=True,
    )
    sub = Client(broker.port, "reader")
    sub.connect()
    assert sub.subscribe("#") == [GRANTED_QOS_1]
    sub.wait_payloads(b"marker")  # retained messages come in topic name order
    assert [(m.topic, m.payload, m.retain) for m in sub.received_now()] == [
        ("public/r", b"public r", True),
        ("zz/marker", b"marker", True),
    ]
    assert sub.subscribe("secrets/r") == [NOT_AUTHORIZED]
    sub.disconnect()


def test_a_share_group_member_gets_no_secret(broker: BrokerProcess) -> None:
    member = Client(broker.port, "member")
    member.connect()
    assert member.subscribe("$share/g/#") == [GRANTED_QOS_1]
    assert member.subscribe("$share/g/secrets/#") == [NOT_AUTHORIZED]
    messages = mixed("shared")
    publish(broker.port, messages)
    member.wait_payloads(b"marker shared", timeout=60)
    assert got(member.received_now()) == public(messages)
    member.disconnect()


def test_strict_mode_refuses_overlapping_filters_and_still_withholds_on_resume(
    tmp_path: Path, sqlite_url: str
) -> None:
    """A session that subscribed `#` under rules without the deny keeps its
    subscription across a restart with the deny and `strict`; it still gets no
    secret, and a new `#` is refused."""
    config = configure(tmp_path, "default allow\n")
    with BrokerProcess(sqlite_url, extra_args=("--config", str(config))) as broker:
        old = Client(broker.port, "old")
        old.connect(clean=False, expiry=600)
        assert old.subscribe("#") == [GRANTED_QOS_1]
        old.disconnect()
        broker.stop()
        configure(tmp_path, DENY_SECRETS, wildcard="strict")
        broker.start()

        sub = Client(broker.port, "strict")
        sub.connect()
        assert sub.subscribe("#", "+/+/+", "$share/g/#", "public/#", "$share/g/public/#") == [
            NOT_AUTHORIZED,
            NOT_AUTHORIZED,
            NOT_AUTHORIZED,
            GRANTED_QOS_1,
            GRANTED_QOS_1,
        ]
        sub.disconnect()

        messages = mixed("resumed")
        publish(broker.port, messages)
        again = Client(broker.port, "old")
        assert again.connect(clean=False, expiry=600) is True
        again.wait_payloads(b"marker resumed")
        assert got(again.received_now()) == public(messages)
        again.disconnect()


@pytest.mark.parametrize("value", ["loose", "Strict!", "1"])
def test_serve_refuses_a_bad_wildcard_mode_in_one_line(tmp_path: Path, value: str) -> None:
    (tmp_path / "acl").write_text(DENY_SECRETS)
    (tmp_path / "riverbed.toml").write_text(f'[auth]\nacl_file = "acl"\nacl_wildcard = "{value}"\n')
    result = subprocess.run(
        [RIVERBED, "serve", "--allow-anonymous", "--mqtt", "127.0.0.1:0",
         "--config", "riverbed.toml", "--db", f"sqlite:///{tmp_path}/x.db"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr == (
        f"error: riverbed.toml: auth.acl_wildcard = {value!r}: must be one of filter, strict\n"
    )
    assert not (tmp_path / "x.db").exists()
