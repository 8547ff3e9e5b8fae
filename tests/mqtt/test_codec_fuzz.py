"""Fuzzing: whatever bytes arrive, only `ProtocolError` leaves the decoder.

Random bytes and mutated valid packets (bits flipped, bytes inserted, deleted,
replaced, the stream cut short) go into decoders of every kind, cut at random
points. Each call either returns packets or raises `ProtocolError`; after an
error every later call raises it again; and whatever the decoder did accept is
a valid packet that encodes and decodes to itself.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.mqtt_packets import after_connect, connects, packets
from riverbed.errors import ProtocolError
from riverbed.mqtt.codec import Decoder, Packet, encode

DECODERS = [
    pytest.param(None, id="server"),
    pytest.param(4, id="3.1.1"),
    pytest.param(5, id="5.0"),
]


def run(decoder: Decoder, data: bytes, cuts: list[int]) -> list[Packet]:
    """Feed `data` in pieces; return what came out before the first error."""
    out: list[Packet] = []
    start = 0
    try:
        for cut in [*sorted(cuts), len(data)]:
            out += decoder.feed(data[start:cut])
            start = cut
    except ProtocolError as exc:
        assert isinstance(exc.reason_code, int)
        assert 0x80 <= exc.reason_code <= 0xFF
        assert str(exc)
        # The decoder is closed now: every later call raises again.
        with pytest.raises(ProtocolError):
            decoder.feed(b"")
        with pytest.raises(ProtocolError):
            decoder.feed(b"\xc0\x00")
    return out


def check_accepted(decoder: Decoder, accepted: list[Packet]) -> None:
    """What the decoder accepted is valid: it encodes, and decodes to itself."""
    level = decoder.protocol_level
    for packet in accepted:
        assert level is not None
        assert Decoder(level).feed(encode(packet, level)) == [packet]


def mutate(rng: random.Random, data: bytes) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        choice = rng.randrange(6)
        at = rng.randrange(len(buffer) + 1)
        if choice == 0 and buffer:
            at = min(at, len(buffer) - 1)
            buffer[at] ^= 1 << rng.randrange(8)
        elif choice == 1:
            buffer[at:at] = rng.randbytes(rng.randint(1, 4))
        elif choice == 2:
            del buffer[at : at + rng.randint(1, 4)]
        elif choice == 3 and buffer:
            at = min(at, len(buffer) - 1)
            buffer[at] = rng.choice([0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)])
        elif choice == 4:
            del buffer[at:]
        else:
            buffer[at:at] = rng.choice([b"\x00", b"\x80\x80\x80\x80", b"\xff\xff", b"\xed\xa0\x80"])
    return bytes(buffer)


@pytest.mark.parametrize("level", DECODERS)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=5))
@settings(max_examples=500)
def test_random_bytes(level: int | None, data: bytes, cuts: list[int]) -> None:
    decoder = Decoder(level)
    check_accepted(decoder, run(decoder, data, [c for c in cuts if c <= len(data)]))


@pytest.mark.parametrize("level", DECODERS)
@given(data=st.data(), tail=st.binary(max_size=200))
@settings(max_examples=200)
def test_random_bytes_after_a_valid_start(
    level: int | None, data: st.DataObject, tail: bytes
) -> None:
    """Random bytes after valid packets, so they reach every packet type's parser."""
    wire_level = level or data.draw(st.sampled_from([4, 5]))
    start = [data.draw(connects(wire_level))] if level is None else []
    start += data.draw(st.lists(after_connect(wire_level), max_size=2))
    wire = b"".join(encode(packet, wire_level) for packet in start)
    decoder = Decoder(level)
    check_accepted(decoder, run(decoder, wire + tail, []))


@pytest.mark.parametrize("level", [pytest.param(4, id="3.1.1"), pytest.param(5, id="5.0")])
@given(data=st.data(), seed=st.integers(0, 2**32))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
def test_mutated_valid_streams(level: int, data: st.DataObject, seed: int) -> None:
    stream = [data.draw(connects(level)), *data.draw(st.lists(after_connect(level), max_size=4))]
    wire = b"".join(encode(packet, level) for packet in stream)
    rng = random.Random(seed)
    mutated = mutate(rng, wire)
    cuts = [rng.randrange(len(mutated) + 1) for _ in range(rng.randrange(4))]
    for decoder in (Decoder(), Decoder(level)):
        check_accepted(decoder, run(decoder, mutated, cuts))


@pytest.mark.parametrize("level", [pytest.param(4, id="3.1.1"), pytest.param(5, id="5.0")])
@given(data=st.data(), seed=st.integers(0, 2**32))
@settings(max_examples=20, suppress_health_check=[HealthCheck.too_slow])
def test_many_mutations(level: int, data: st.DataObject, seed: int) -> None:
    """A wider, cheaper sweep: 250 mutations of pairs of packets per example."""
    rng = random.Random(seed)
    samples = data.draw(st.lists(packets(level), min_size=4, max_size=8))
    wires = [encode(packet, level) for packet in samples]
    for _ in range(250):
        mutated = mutate(rng, rng.choice(wires) + rng.choice(wires))
        decoder = Decoder(level)
        check_accepted(decoder, run(decoder, mutated, [rng.randrange(len(mutated) + 1)]))


def test_every_first_byte() -> None:
    """Each of the 256 first bytes, with every short body, on every decoder kind."""
    for level in (None, 4, 5):
        for first in range(256):
            for body in (b"", b"\x00", b"\x02\x00\x01", b"\x03\x00\x01\x00", b"\x7f"):
                decoder = Decoder(level)
                check_accepted(decoder, run(decoder, bytes((first,)) + body, []))
