"""`encode_publish` remembers the encoded form of small property sets: the bytes
are always those of the packet's own properties, however many sets it has seen."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.mqtt_packets import publishes
from riverbed.mqtt.codec import Decoder, Publish, PublishProperties, encode, encode_publish


def fields(packet: Publish) -> bytes:
    return encode_publish(
        packet.topic,
        packet.payload,
        packet.qos,
        packet.retain,
        packet.dup,
        packet.packet_id,
        packet.properties,
        True,
    )


@given(st.lists(publishes(5), min_size=1, max_size=6))
@settings(max_examples=300)
def test_each_publish_gets_its_own_properties_every_time(packets: list[Publish]) -> None:
    for _ in range(2):  # the second time from what the first remembered
        for packet in packets:
            assert Decoder(5).feed(fields(packet)) == [packet]
            assert fields(packet) == encode(packet, 5)


def test_sets_that_differ_in_one_property_or_are_large_are_encoded_as_they_are() -> None:
    base = PublishProperties(user_properties=(("key", "room-1"),), message_expiry_interval=60)
    sets = [
        base,
        dataclasses.replace(base, topic_alias=1),
        dataclasses.replace(base, topic_alias=2),
        dataclasses.replace(base, message_expiry_interval=59),
        dataclasses.replace(base, correlation_data=bytes(1000)),  # too large to keep
        base,
    ]
    for props in sets * 2:
        packet = Publish("a/b", b"x", qos=1, packet_id=9, properties=props)
        assert Decoder(5).feed(fields(packet)) == [packet]
