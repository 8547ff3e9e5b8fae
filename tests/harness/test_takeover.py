"""The takeover harness's order check (`Takeovers.interleaved`): a message to a
connection newer than one its successor alone got is interleaved; the
successor getting again what its predecessor left unacknowledged is not."""

from __future__ import annotations

from harness.takeover import Delivery, Takeovers


def _run(deliveries: list[tuple[int, int]]) -> Takeovers:
    run = Takeovers([1], qos=1)
    run.deliveries = [
        Delivery(seq, connection, float(i)) for i, (seq, connection) in enumerate(deliveries)
    ]
    return run


def test_a_stream_handed_from_one_connection_to_the_next_is_not_interleaved() -> None:
    assert _run([(0, 0), (1, 0), (2, 1), (3, 1), (4, 2)]).interleaved() == []
    # QoS 1: the successor is sent again what its predecessor had not acknowledged.
    assert _run([(0, 0), (1, 0), (1, 1), (2, 1)]).interleaved() == []
    # Wall-clock order does not matter: the predecessor's last one counted last.
    assert _run([(0, 0), (1, 1), (2, 1), (0, 0)]).interleaved() == []


def test_two_connections_delivering_at_once_are_found() -> None:
    found = _run([(0, 0), (1, 1), (2, 0), (3, 1), (4, 0)]).interleaved()
    assert found == [
        "message 2 to connection 0 after message 1 to connection 1",
        "message 4 to connection 0 after message 1 to connection 1",
    ]
