"""What the chaos run counts (bench/_chaos_tally.py), on made-up records: a
message acknowledged and never delivered is lost; per key a first delivery
after a later one is an order violation; a repeat is a republished copy (a
second log copy, where the consumer names the copy; else up to the log's extra
copies), within a kill's window (a disruption on the path within `window`
seconds after the previous acknowledgement), or stale. A shared group's path
also has what the broker logs about the group: fences and Leader changes."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos_tally import (
    Clock,
    Delivery,
    Disruption,
    GroupEvent,
    group_disruptions,
    local_time,
    message_id,
    parse_group_log,
    parse_id,
    tally,
)

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


GROUP = "$share/g/chaos/#"
NODE0_LOG = """\
--- start 1
2026-11-26 20:18:10,206 INFO riverbed.mqtt.broker: listening for MQTT on 127.0.0.1:59973
2026-11-26 20:18:15,211 INFO riverbed.sharedsub.host: group $share/g/chaos/#: leading as v1/leader/b
2026-11-26 20:18:18,716 INFO riverbed.sharedsub.agent: group $share/g/chaos/#: borrower s1/aa/1 \
replaced by s1/aa/2: the Leader may have dropped this Borrower (fence)
2026-11-26 20:18:19,000 INFO riverbed.sharedsub.agent: group $share/g/chaos/#: borrower s1/aa/2 \
replaced by s1/aa/3: the Leader did not answer a ping in time
2026-11-26 20:18:20,500 INFO riverbed.sharedsub.host: group $share/g/other/#: leading as v1/leader/c
2026-11-26 20:18:21,000 INFO riverbed.mqtt.connection: group $share/g/chaos/#: leading as nobody
2026-11-26 20:22:19,669 INFO riverbed.sharedsub.host: group $share/g/chaos/#: leading as v2/leader/d
2026-11-26 20:23:41,555 WARNING riverbed.cluster.bus: node v2: the shared-subscription \
listener reconnects
2026-11-26 20:23:41,604 WARNING riverbed.sharedsub.host: group $share/g/chaos/#: leader \
v2/leader/d stops: its claim was taken
"""
"""A broker node's log: both INFO lines the tally reads, a WARNING "stops" line,
and lines it ignores (other loggers, another group, another replacement reason)."""


def test_a_broker_log_gives_the_groups_fences_and_leader_starts_and_stops() -> None:
    events = parse_group_log(NODE0_LOG, "node0", GROUP)
    assert [(e.what, e.node) for e in events] == [
        ("leading", "node0"),
        ("fence", "node0"),
        ("leading", "node0"),
        ("leader-stops", "node0"),
    ]
    assert events[1].wall == local_time("2026-11-26 20:18:18", 716)
    assert round(events[1].wall - events[0].wall, 3) == 3.505


def test_the_groups_first_leader_is_no_disruption_and_times_move_to_the_runs_clock() -> None:
    wall = local_time("2026-11-26 20:18:00")
    clock = Clock(wall, 1000.0)  # 20:18:00 is 1000.0 on the run's clock
    events = [
        GroupEvent(wall + 15, "node1", "leading"),
        GroupEvent(wall + 10, "node0", "leading"),
        GroupEvent(wall + 20, "node0", "fence"),
    ]
    assert group_disruptions(events, clock) == [
        Disruption(1015.0, "node1", "leading"),
        Disruption(1020.0, "node0", "fence"),
    ]


def shared_path(log: str, clock: Clock) -> list[Disruption]:
    return group_disruptions(parse_group_log(log, "node0", GROUP), clock)


# The fence line (20:18:18,716) is 13472.2 on the run's clock.
PG2_CLOCK = Clock(local_time("2026-11-26 20:18:18", 716), 13472.2)


def test_a_repeat_right_after_a_fence_on_the_shared_path_is_in_window() -> None:
    # The repeat of /work/chaos-pg2's stale shared message, acknowledged just
    # after the fence and delivered again by the Borrower that replaced the fenced one.
    repeat = [d("p0.k2.11", 13472.45), d("p0.k2.11", 13474.31)]
    counts = tally("c", repeat, set(), Counter(), shared_path(NODE0_LOG, PG2_CLOCK), 10)
    assert (counts.in_window, counts.stale) == (1, [])


def test_the_same_repeat_on_another_consumers_path_is_still_stale() -> None:
    # Another consumer's path has only the run's own kills and restarts: none here.
    repeat = [d("p0.k2.11", 13472.45), d("p0.k2.11", 13474.31)]
    counts = tally("c", repeat, set(), Counter(), [], 10)
    assert counts.stale == [("p0.k2.11", 13472.45, 13474.31)] and counts.in_window == 0


def test_a_repeat_long_after_a_fence_is_stale() -> None:
    # Acknowledged 30 s after the fence (and long before the next Leader change).
    repeat = [d("p0.k2.11", 13502.2), d("p0.k2.11", 13504.0)]
    counts = tally("c", repeat, set(), Counter(), shared_path(NODE0_LOG, PG2_CLOCK), 10)
    assert counts.stale == [("p0.k2.11", 13502.2, 13504.0)] and counts.in_window == 0


def test_a_leader_change_on_the_shared_path_puts_a_repeat_in_window() -> None:
    # 20:22:19,669, the second "leading as": 240.953 s after the fence.
    change = 13472.2 + 240.953
    repeat = [d("p0.k0.5", change - 2), d("p0.k0.5", change + 1)]
    counts = tally("c", repeat, set(), Counter(), shared_path(NODE0_LOG, PG2_CLOCK), 10)
    assert (counts.in_window, counts.stale) == (1, [])
