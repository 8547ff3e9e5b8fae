"""Round trips: any valid packet, encoded at either level and decoded, is itself.

`harness.mqtt_packets` draws every packet type with every property; the bytes
are fed whole, cut at random points, and run together with other packets,
because a decoder must not care how the stream is cut.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.mqtt_packets import after_connect, connects, packets
from riverbed.mqtt.codec import Decoder, Packet, PacketType, Unsuback, encode

LEVELS = [pytest.param(4, id="3.1.1"), pytest.param(5, id="5.0")]


def feed_in_pieces(decoder: Decoder, data: bytes, cuts: list[int]) -> list[Packet]:
    out: list[Packet] = []
    start = 0
    for cut in sorted(cuts):
        out += decoder.feed(data[start:cut])
        start = cut
    return out + decoder.feed(data[start:])


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
@settings(max_examples=300)
def test_every_packet_round_trips(level: int, data: st.DataObject) -> None:
    packet = data.draw(packets(level))
    wire = encode(packet, level)
    assert wire[0] >> 4 == PacketType[type(packet).__name__.upper()]
    assert Decoder(level).feed(wire) == [packet]
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=6))
    assert feed_in_pieces(Decoder(level), wire, cuts) == [packet]


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
@settings(max_examples=100)
def test_a_connection_stream_round_trips(level: int, data: st.DataObject) -> None:
    """A CONNECT then many packets, cut anywhere, on a server-side decoder."""
    stream = [data.draw(connects(level)), *data.draw(st.lists(after_connect(level), max_size=8))]
    wire = b"".join(encode(packet, level) for packet in stream)
    cuts = data.draw(st.lists(st.integers(0, len(wire)), max_size=10))
    decoder = Decoder()
    assert feed_in_pieces(decoder, wire, cuts) == stream
    assert decoder.protocol_level == level


@pytest.mark.parametrize("level", LEVELS)
@given(data=st.data())
@settings(max_examples=50)
def test_byte_by_byte(level: int, data: st.DataObject) -> None:
    stream = data.draw(st.lists(packets(level), min_size=1, max_size=3))
    wire = b"".join(encode(packet, level) for packet in stream)
    assert feed_in_pieces(Decoder(level), wire, list(range(len(wire)))) == stream


@given(data=st.data())
@settings(max_examples=200)
def test_3_1_1_packets_mean_the_same_at_level_5(data: st.DataObject) -> None:
    """A 3.1.1 packet is also a 5.0 packet, the levels differ only on the wire;
    except the UNSUBACK, which has a reason code per filter in 5.0 only."""
    packet = data.draw(packets(4).filter(lambda packet: not isinstance(packet, Unsuback)))
    assert Decoder(5).feed(encode(packet, 5)) == [packet]
