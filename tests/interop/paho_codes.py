"""paho-mqtt 2 reports an MQTT 3.1.1 CONNACK return code as the MQTT 5 reason
code of the same meaning: `RETURN_CODES` maps it back to what was on the wire.
(Imported by `test_paho.py` and by the aiomqtt driver, which runs as a script.)"""

RETURN_CODES = {0x84: 1, 0x85: 2, 0x88: 3, 0x86: 4, 0x87: 5}


def wire_code(reason: int, version: int) -> int:
    """The CONNACK code on the wire for paho's `reason` (`version` 5 or 4)."""
    return reason if version == 5 else RETURN_CODES.get(reason, reason)
