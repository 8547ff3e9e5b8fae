"""What the chaos run counts (bench/_chaos_tally.py), on made-up records: a
message acknowledged and never delivered is lost; per key a first delivery
after a later one is an order violation; a repeat is a republished copy (a
second log copy, where the consumer names the copy; else up to the log's extra
copies), within a kill's window (a disruption on the path within `window`
seconds after the previous acknowledgement), or stale."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos_tally import Delivery, Disruption, message_id, parse_id, tally

KILL = [Disruption(10.0, "node0", "kill")]


def d(message: str, at: float, copy: str | None = None, dup: bool | None = None) -> Delivery:
    return Delivery("c", message, at, copy=copy, dup=dup)


def test_ids_name_key_and_sequence() -> None:
    assert parse_id("p3.k1.42") == ("p3k1", 42)


def test_lost_is_acknowledged_and_never_delivered() -> None:
    counts = tally("c", [d("p0.k0.0", 1)], {"p0.k0.0", "p0.k0.1"}, Counter(), KILL, 5)
    assert counts.lost == ["p0.k0.1"]
    assert counts.delivered == 1 and counts.duplicates == 0


def test_order_violation_is_a_first_delivery_behind_a_later_one_of_its_key() -> None:
    deliveries = [d("p0.k0.0", 1), d("p0.k0.2", 2), d("p0.k1.0", 2.5), d("p0.k0.1", 3)]
    counts = tally("c", deliveries, set(), Counter(), [], 5)
    assert counts.order_violations == [("p0k0", 1, 2)]
    # A repeat of an earlier message is a duplicate, not an order violation.
    again = [d("p0.k0.0", 6), d("p0.k0.1", 7), d("p0.k0.0", 11, dup=True)]
    counts = tally("c", again, set(), Counter(), KILL, 5)
    assert counts.order_violations == [] and counts.in_window == 1


def test_a_repeat_within_the_window_before_a_kill_is_in_window() -> None:
    counts = tally("c", [d("p0.k0.0", 6), d("p0.k0.0", 12, dup=True)], set(), Counter(), KILL, 5)
    assert (counts.in_window, counts.in_window_dup_flag, counts.stale) == (1, 1, [])
    assert counts.largest_window == 4


def test_a_repeat_acknowledged_long_before_the_kill_is_stale() -> None:
    counts = tally("c", [d("p0.k0.0", 2), d("p0.k0.0", 12)], set(), Counter(), KILL, 5)
    assert counts.stale == [("p0.k0.0", 2, 12)] and counts.in_window == 0


def test_a_repeat_with_no_disruption_between_is_stale() -> None:
    # Both after the kill and its slack (SLACK s).
    counts = tally("c", [d("p0.k0.0", 17), d("p0.k0.0", 18)], set(), Counter(), KILL, 5)
    assert len(counts.stale) == 1


def test_a_second_log_copy_is_a_republished_copy() -> None:
    # The consumer names the copy: exact.
    named = [d("p0.k0.0", 2, copy="s@1"), d("p0.k0.0", 3, copy="s@7")]
    counts = tally("c", named, set(), Counter({"p0.k0.0": 2}), [], 5)
    assert (counts.republished, counts.stale) == (1, [])
    # The same copy again, with no disruption: stale.
    same = [d("p0.k0.0", 2, copy="s@1"), d("p0.k0.0", 3, copy="s@1")]
    assert len(tally("c", same, set(), Counter({"p0.k0.0": 2}), [], 5).stale) == 1
    # MQTT (no copy named): charged to the log's extra copies, then stale.
    mqtt = [d("p0.k0.0", 2), d("p0.k0.0", 3), d("p0.k0.0", 4)]
    counts = tally("c", mqtt, set(), Counter({"p0.k0.0": 2}), [], 5)
    assert (counts.republished, len(counts.stale)) == (1, 1)


def test_message_id_undoes_parse_id() -> None:
    assert message_id(*parse_id("p12.k3.40")) == "p12.k3.40"


def test_an_acknowledgement_recorded_just_after_the_kill_is_in_window() -> None:
    # An HTTP 200 answered to a job killed while it waited: recorded after the kill.
    counts = tally("c", [d("p0.k0.0", 10.3), d("p0.k0.0", 60)], set(), Counter(), KILL, 5)
    assert (counts.in_window, counts.stale) == (1, [])
