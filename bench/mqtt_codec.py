"""MQTT codec micro-benchmark: encode and decode rates of a 100-byte QoS 1 PUBLISH.

Informational, no peer: it measures `riverbed.mqtt.codec` alone, per protocol
level, and beside it a "floor": the least Python can do for the same bytes (slice
the fields out with no validation and no packet object; join them back). The
ratio codec / floor is the price of building checked packet objects.

Rows:

- encode: `encode(publish, level)` of a packet built once (a broker forwarding
  one message);
- build + encode: `Publish(...)` and `encode` (a delivery with its own packet id);
- decode, one per feed: `Decoder.feed` with one whole packet per call;
- decode, 100 per feed: one call with 100 packets back to back;
- PUBACK build + encode: the answer to each QoS 1 PUBLISH; the same bytes
  from `encode_puback` (no packet object), and 100 at a time from `encode_pubacks`;
- and, at level 5, the same PUBLISH with two properties (a user property `key`
  and a Message Expiry Interval).

Each row is the best of `--rounds` rounds of `--count` packets.

    .venv/bin/python bench/mqtt_codec.py [--count N] [--rounds R]
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

from riverbed.mqtt.codec import (
    Decoder,
    Puback,
    Publish,
    PublishProperties,
    encode,
    encode_puback,
    encode_pubacks,
)

TOPIC = "sensors/room-1/temperature"
PAYLOAD = bytes(range(100))


def best_rate(work: Callable[[int], None], count: int, rounds: int) -> float:
    """Packets per second of `work(count)`, the best of `rounds` runs."""
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        work(count)
        best = min(best, time.perf_counter() - start)
    return count / best


def floor_decode(data: bytes, v5: bool) -> tuple[str, int, bytes]:
    """Slice a QoS 1 PUBLISH apart with no checks (and, in 5.0, no properties)."""
    pos = 2 if data[1] < 0x80 else 3
    size = (data[pos] << 8) | data[pos + 1]
    pos += 2 + size
    topic = data[pos - size : pos].decode()
    packet_id = (data[pos] << 8) | data[pos + 1]
    return topic, packet_id, data[pos + 3 if v5 else pos + 2 :]


def floor_encode(topic: bytes, packet_id: int, payload: bytes, v5: bool) -> bytes:
    parts = [len(topic).to_bytes(2, "big"), topic, packet_id.to_bytes(2, "big")]
    if v5:
        parts.append(b"\x00")
    parts.append(payload)
    length = sum(len(part) for part in parts)
    # The Remaining Length of these packets takes one or two bytes.
    short = length < 0x80
    head = bytes((0x32, length)) if short else bytes((0x32, length & 0x7F | 0x80, length >> 7))
    return head + b"".join(parts)


def rows(level: int, count: int, rounds: int) -> list[tuple[str, float, float | None]]:
    publish = Publish(TOPIC, PAYLOAD, qos=1, packet_id=10)
    wire = encode(publish, level)
    batch = wire * 100
    topic_bytes = TOPIC.encode()

    def encode_loop(n: int) -> None:
        for _ in range(n):
            encode(publish, level)

    def build_encode_loop(n: int) -> None:
        for i in range(n):
            encode(Publish(TOPIC, PAYLOAD, 1, False, False, i % 65535 + 1), level)

    def decode_loop(n: int) -> None:
        feed = Decoder(level).feed
        for _ in range(n):
            feed(wire)

    def decode_batch_loop(n: int) -> None:
        feed = Decoder(level).feed
        for _ in range(n // 100):
            feed(batch)

    def puback_loop(n: int) -> None:
        for i in range(n):
            encode(Puback(i % 65535 + 1), level)

    def puback_bytes_loop(n: int) -> None:
        for i in range(n):
            encode_puback(i % 65535 + 1, 0, level == 5)

    ids = list(range(1, 101))

    def pubacks_loop(n: int) -> None:
        for _ in range(n // 100):
            encode_pubacks(ids)

    def floor_encode_loop(n: int) -> None:
        for i in range(n):
            floor_encode(topic_bytes, i % 65535 + 1, PAYLOAD, level == 5)

    def floor_decode_loop(n: int) -> None:
        for _ in range(n):
            floor_decode(wire, level == 5)

    floor_enc = best_rate(floor_encode_loop, count, rounds)
    assert floor_decode(wire, level == 5) == (TOPIC, 10, PAYLOAD)
    assert floor_encode(topic_bytes, 10, PAYLOAD, level == 5) == wire
    floor_dec = best_rate(floor_decode_loop, count, rounds)
    out: list[tuple[str, float, float | None]] = [
        ("encode", best_rate(encode_loop, count, rounds), floor_enc),
        ("build + encode", best_rate(build_encode_loop, count, rounds), floor_enc),
        ("decode, one per feed", best_rate(decode_loop, count, rounds), floor_dec),
        ("decode, 100 per feed", best_rate(decode_batch_loop, count, rounds), floor_dec),
        ("PUBACK build + encode", best_rate(puback_loop, count, rounds), None),
        ("PUBACK encode_puback", best_rate(puback_bytes_loop, count, rounds), None),
        ("PUBACK, 100 per encode_pubacks", best_rate(pubacks_loop, count, rounds), None),
    ]
    if level == 5:
        rich = Publish(
            TOPIC,
            PAYLOAD,
            qos=1,
            packet_id=10,
            properties=PublishProperties(
                message_expiry_interval=3600, user_properties=(("key", "room-1"),)
            ),
        )
        rich_wire = encode(rich, 5)

        def rich_encode_loop(n: int) -> None:
            for _ in range(n):
                encode(rich, 5)

        def rich_decode_loop(n: int) -> None:
            feed = Decoder(5).feed
            for _ in range(n):
                feed(rich_wire)

        out.append(("encode, 2 properties", best_rate(rich_encode_loop, count, rounds), None))
        out.append(("decode, 2 properties", best_rate(rich_decode_loop, count, rounds), None))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--count", type=int, default=200_000, help="packets per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the best one counts")
    args = parser.parse_args()
    print(
        f"MQTT codec, a {len(PAYLOAD)}-byte QoS 1 PUBLISH to {TOPIC!r};"
        f" Python {platform.python_version()} on {platform.machine()}, best of {args.rounds}"
    )
    for level, name in ((4, "MQTT 3.1.1"), (5, "MQTT 5.0")):
        print(f"\n{name} ({len(encode(Publish(TOPIC, PAYLOAD, 1, packet_id=10), level))} bytes)")
        print(f"  {'':30} {'packets/s':>12} {'µs/packet':>10} {'floor/s':>12} {'codec/floor':>11}")
        for label, rate, floor in rows(level, args.count, args.rounds):
            floor_text = f"{floor:12,.0f} {rate / floor:10.2f}x" if floor else ""
            print(f"  {label:30} {rate:12,.0f} {1e6 / rate:10.2f} {floor_text}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
