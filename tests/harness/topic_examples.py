"""(filter, topic name, matches?) examples shared by the matcher and trie tests."""

from __future__ import annotations

MATCH_EXAMPLES: list[tuple[str, str, bool]] = [
    # Examples of [MQTT-4.7.1].
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "a", True),
    ("+/#", "a", True),
    ("a/b", "a/b", True),
    ("a/b", "a", False),
    ("a//b", "a//b", True),
    # [MQTT-4.7.2-1]: $-topics are not matched by a leading wildcard.
    ("#", "$SYS/x", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$SYS", "$SYS", True),
    ("a/$x", "a/$x", True),
    ("+/$x", "a/$x", True),
]
