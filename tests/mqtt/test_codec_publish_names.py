"""PUBLISH Topic Names are decoded once per name and remembered: a remembered
name is still checked on every PUBLISH, and a broken one is never remembered."""

from __future__ import annotations

import pytest

from riverbed.mqtt.codec import Decoder, ProtocolError, Publish, encode


def publish_bytes(topic: bytes) -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + b"\x00\x07" + b"\x00" + b"payload"
    return bytes((0x32, len(body))) + body


def test_a_name_seen_before_decodes_to_the_same_text() -> None:
    wire = encode(Publish("dé/jà", b"x", qos=1, packet_id=7), 5)
    first = Decoder(5).feed(wire * 3)
    assert [p.topic for p in first] == ["dé/jà"] * 3
    assert Decoder(5).feed(wire) == first[:1]


@pytest.mark.parametrize(
    ("topic", "reason", "rule"),
    [
        (b"a/+", 0x82, "wildcard"),
        (b"a/\x00", 0x81, r"U\+0000"),
        (b"a/\xff", 0x81, "not well-formed UTF-8"),
    ],
)
def test_a_broken_name_is_refused_every_time(topic: bytes, reason: int, rule: str) -> None:
    for _ in range(3):
        with pytest.raises(ProtocolError, match=rule) as refused:
            Decoder(5).feed(publish_bytes(topic))
        assert refused.value.reason_code == reason
