"""The outgoing QoS 2 window of a session: what must survive a broker crash.

[MQTT-4.3.3] has the sender keep a QoS 2 message's packet id through PUBLISH,
PUBREC, PUBREL, PUBCOMP. For exactly once across a broker crash the session
record (compare-and-set, like every record write) holds, per message in the
window, its stream and offset, its packet id and its phase:

- `SENT`: persisted before the PUBLISH goes out, so after a crash the same
  message goes out again with the same packet id and DUP=1 and the client's own
  deduplication holds;
- `RELEASED`: PUBREC came; persisted before the PUBREL goes out, so after a
  crash the broker resends the PUBREL [MQTT-4.4.0-1], never the PUBLISH (the
  client has forgotten the packet id after PUBREL and would take it as new);
- `COMPLETE`: PUBCOMP came. Kept until a checkpoint has committed a cursor past
  the offset: until then a crash would replay the message, and the entry says
  it was delivered already.

The session (`sessions/session.py`) holds a new PUBLISH or PUBREL back until a
`Persist` it asked for is answered with `Persisted`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class Phase(IntEnum):
    """Where one outgoing QoS 2 message is in its exchange."""

    SENT = 0
    RELEASED = 1
    COMPLETE = 2


@dataclass(frozen=True, slots=True)
class WindowEntry:
    """One message of the outgoing QoS 2 window."""

    stream: int
    offset: int
    packet_id: int
    phase: Phase

    def to_json(self) -> list[int]:
        return [self.stream, self.offset, self.packet_id, int(self.phase)]

    @classmethod
    def from_json(cls, raw: list[int]) -> WindowEntry:
        stream, offset, packet_id, phase = raw
        return cls(stream, offset, packet_id, Phase(phase))
