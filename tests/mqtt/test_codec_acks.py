"""The acknowledgements as bytes (`encode_puback` and its siblings, `encode_pubacks`):
the same bytes as `encode` of the packet, and they decode back to it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from riverbed.mqtt.codec import (
    Decoder,
    ProtocolError,
    Puback,
    PubackReason,
    Pubcomp,
    PubcompReason,
    Pubrec,
    PubrecReason,
    Pubrel,
    PubrelReason,
    encode,
    encode_puback,
    encode_pubacks,
    encode_pubcomp,
    encode_pubrec,
    encode_pubrel,
)

AckPacket = Puback | Pubrec | Pubrel | Pubcomp
KINDS: list[tuple[Callable[[int, int, bool], bytes], type[AckPacket], type[int]]] = [
    (encode_puback, Puback, PubackReason),
    (encode_pubrec, Pubrec, PubrecReason),
    (encode_pubrel, Pubrel, PubrelReason),
    (encode_pubcomp, Pubcomp, PubcompReason),
]
IDS = [pytest.param(kind, id=kind[1].__name__) for kind in KINDS]
packet_ids = st.integers(1, 0xFFFF)


@pytest.mark.parametrize("kind", IDS)
@given(data=st.data())
@settings(max_examples=200)
def test_the_same_bytes_as_the_packet_and_back(
    kind: tuple[Callable[[int, int, bool], bytes], type[AckPacket], type[int]],
    data: st.DataObject,
) -> None:
    write, packet_class, reasons = kind
    packet_id = data.draw(packet_ids)
    reason = data.draw(st.sampled_from(list(reasons)))  # type: ignore[call-overload]
    packet = packet_class(packet_id, reason)
    wire = write(packet_id, reason, True)
    assert wire == encode(packet, 5)
    assert Decoder(5).feed(wire) == [packet]
    if reason:
        with pytest.raises(ProtocolError, match=r"3\.1\.1 cannot carry"):
            write(packet_id, reason, False)
    else:
        assert write(packet_id, reason, False) == encode(packet, 4) == wire
        assert Decoder(4).feed(wire) == [packet]


@given(st.lists(packet_ids, max_size=40))
@settings(max_examples=300)
def test_many_pubacks_are_the_pubacks_back_to_back(ids: list[int]) -> None:
    """Short and long runs (the long ones are spliced, not joined)."""
    wire = encode_pubacks(ids)
    assert wire == b"".join(encode(Puback(packet_id), 5) for packet_id in ids)
    for level in (4, 5):
        assert Decoder(level).feed(wire) == [Puback(packet_id) for packet_id in ids]


@pytest.mark.parametrize("bad", [0, 0x10000, -1, 1.5, None, "7"])
@pytest.mark.parametrize("kind", IDS)
def test_a_packet_id_outside_1_to_65535_is_refused(
    kind: tuple[Callable[[int, int, bool], bytes], type[AckPacket], type[int]], bad: object
) -> None:
    write, packet_class, _ = kind
    with pytest.raises(
        ProtocolError,
        match=rf"{packet_class.__name__.upper()}'s Packet Identifier must be 1..65535, not {bad!r}",
    ):
        write(bad, 0, True)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [1, 5, 12, 100])
@pytest.mark.parametrize("bad", [0, 0x10000, -1, 1.5, None])
def test_many_pubacks_refuse_a_bad_packet_id_and_name_it(count: int, bad: object) -> None:
    ids: list[object] = [7] * count
    ids[count // 2] = bad
    with pytest.raises(ProtocolError, match=rf"Packet Identifier must be 1..65535, not {bad!r}"):
        encode_pubacks(ids)  # type: ignore[arg-type]


def test_a_reason_code_of_another_packet_is_refused() -> None:
    # 0x8E Session taken over is a DISCONNECT reason; 0x92 is PUBREL's and
    # PUBCOMP's, not PUBACK's.
    with pytest.raises(ProtocolError, match="PUBACK has reason code 0x8E"):
        encode_puback(7, 0x8E)
    with pytest.raises(ProtocolError, match="PUBACK has reason code 0x92"):
        encode_puback(7, 0x92)
    assert encode_pubrel(7, 0x92) == encode(Pubrel(7, PubrelReason(0x92)), 5)


def test_pubacks_decode_the_same_before_and_after_the_connect_and_cut_anywhere() -> None:
    """The decoder reads a Success PUBACK on a short path once the level is known;
    the same bytes in the CONNECT's feed take the general one."""
    connect = b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x00\x00\x00\x00"
    acks = encode_pubacks(list(range(1, 13))) + encode_puback(13, 0x10)
    expected = [Puback(i) for i in range(1, 13)] + [Puback(13, PubackReason(0x10))]
    decoder = Decoder()
    assert decoder.feed(connect + acks)[1:] == expected
    assert decoder.feed(acks) == expected
    assert decoder.feed(acks[:3]) == []
    assert decoder.feed(acks[3:]) == expected


def test_a_puback_with_packet_id_0_or_over_the_size_limit_is_refused() -> None:
    with pytest.raises(ProtocolError, match=r"PUBACK Packet Identifier must be 1\.\.65535, not 0"):
        Decoder(5).feed(b"\x40\x02\x00\x00")
    with pytest.raises(ProtocolError, match="larger than the maximum packet size 3") as refused:
        Decoder(4, max_packet_size=3).feed(b"\x40\x02\x00\x07")
    assert refused.value.reason_code == 0x95
