"""A sans-I/O MQTT codec: every MQTT 5.0 packet and property, and MQTT 3.1.1.

    from riverbed.mqtt.codec import Decoder, Publish, encode

    decoder = Decoder()                      # a server's side of a new connection
    for packet in decoder.feed(chunk):       # any cut of the byte stream
        ...
    data = encode(Publish("a/b", b"hi", qos=1, packet_id=7), decoder.protocol_level)
    ack = encode_puback(7)                   # the acknowledgements as bytes, no packet

Packets are frozen, slotted dataclasses (`Connect`, `Connack`, `Publish`,
`Puback`, `Pubrec`, `Pubrel`, `Pubcomp`, `Subscribe`, `Suback`, `Unsubscribe`,
`Unsuback`, `Pingreq`, `Pingresp`, `Disconnect`, `Auth`; `Packet` is their
union) that validate themselves when built. MQTT 5 properties are one typed
class per packet (`PublishProperties`, `ConnectProperties`, ...), reason codes
one enum per packet (`ConnectReason`, `PubackReason`, ...).

`encode(packet, protocol_level)` writes a packet for MQTT 3.1.1 (4) or 5.0 (5),
losslessly or not at all. `encode_publish` and `encode_puback`,
`encode_pubrec`, `encode_pubrel`, `encode_pubcomp` (and `encode_pubacks` for
many successful PUBACKs at once) write the packets a broker sends per message
straight from their fields. `Decoder(protocol_level=None, max_packet_size=...)`
takes bytes as they arrive and returns whole packets.

Every rule the codec checks raises `riverbed.errors.ProtocolError` (a
`ValueError`), whose `reason_code` is the MQTT 5 reason code to answer with and
whose message cites the rule ([MQTT-x.y.z-n] statement ids, or the section for
rules without one). Statement ids are MQTT 5.0's unless marked "(3.1.1)". Nothing
else escapes `Decoder.feed`.

Decisions where the specifications leave room:

- MQTT 3.1 (protocol name "MQIsdp", level 3) is refused with 0x84 Unsupported
  Protocol Version, as is any level but 4 and 5 and any protocol name but
  "MQTT". Its CONNACK lacks Session Present, which persistent sessions need.
  The connection answers 0x84 with the 3.1.1 form of CONNACK (return code 1),
  which 3.1 and 3.1.1 clients both read (3.1.1 [MQTT-3.1.2-2]).
- Non-minimal Variable Byte Integers are accepted ([MQTT-1.5.5-1] binds the
  sender); five bytes or more are malformed.
- Topic name and filter rules ([MQTT-4.7], [MQTT-3.3.2-2], [MQTT-4.8.2-1/2]) are
  Protocol Errors (0x82): the packet parses but holds what the protocol forbids;
  ill-formed UTF-8 and U+0000 are Malformed Packets (0x81) as §1.5.4 says. A
  Topic Alias of 0 is 0x94 Topic Alias invalid (§3.3.4). `$share/` filters are
  checked as shared subscriptions at both protocol levels.
- Disallowed Unicode code points (controls, non-characters; a SHOULD NOT,
  §1.5.4) and payloads that contradict their Payload Format Indicator are let
  through: whether to refuse them is the broker's policy (§5.4.9).
- A reason code outside its packet's table is a Protocol Error (0x82).
"""

from riverbed.errors import ProtocolError

from .decoder import Decoder
from .encoder import (
    encode,
    encode_puback,
    encode_pubacks,
    encode_pubcomp,
    encode_publish,
    encode_pubrec,
    encode_pubrel,
)
from .packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    RetainHandling,
    Suback,
    Subscribe,
    SubscribeTopic,
    Unsuback,
    Unsubscribe,
    Will,
)
from .properties import (
    NO_ACK_PROPERTIES,
    NO_AUTH_PROPERTIES,
    NO_CONNACK_PROPERTIES,
    NO_CONNECT_PROPERTIES,
    NO_DISCONNECT_PROPERTIES,
    NO_PUBLISH_PROPERTIES,
    NO_SUBSCRIBE_PROPERTIES,
    NO_UNSUBSCRIBE_PROPERTIES,
    NO_WILL_PROPERTIES,
    AckProperties,
    AuthProperties,
    ConnackProperties,
    ConnectProperties,
    DisconnectProperties,
    PropertyId,
    PublishProperties,
    SubscribeProperties,
    UnsubscribeProperties,
    WillProperties,
)
from .reasons import (
    CONNACK_RETURN_CODES,
    AuthReason,
    ConnectReason,
    DisconnectReason,
    PubackReason,
    PubcompReason,
    PubrecReason,
    PubrelReason,
    SubackReason,
    UnsubackReason,
)
from .wire import MAX_PACKET_SIZE

MQTT_3_1_1 = 4
"""Protocol level of MQTT 3.1.1."""
MQTT_5 = 5
"""Protocol level of MQTT 5.0."""

__all__ = [
    "CONNACK_RETURN_CODES",
    "MAX_PACKET_SIZE",
    "MQTT_3_1_1",
    "MQTT_5",
    "NO_ACK_PROPERTIES",
    "NO_AUTH_PROPERTIES",
    "NO_CONNACK_PROPERTIES",
    "NO_CONNECT_PROPERTIES",
    "NO_DISCONNECT_PROPERTIES",
    "NO_PUBLISH_PROPERTIES",
    "NO_SUBSCRIBE_PROPERTIES",
    "NO_UNSUBSCRIBE_PROPERTIES",
    "NO_WILL_PROPERTIES",
    "AckProperties",
    "Auth",
    "AuthProperties",
    "AuthReason",
    "Connack",
    "ConnackProperties",
    "Connect",
    "ConnectProperties",
    "ConnectReason",
    "Decoder",
    "Disconnect",
    "DisconnectProperties",
    "DisconnectReason",
    "Packet",
    "PacketType",
    "Pingreq",
    "Pingresp",
    "PropertyId",
    "ProtocolError",
    "Puback",
    "PubackReason",
    "Pubcomp",
    "PubcompReason",
    "Publish",
    "PublishProperties",
    "Pubrec",
    "PubrecReason",
    "Pubrel",
    "PubrelReason",
    "RetainHandling",
    "Suback",
    "SubackReason",
    "Subscribe",
    "SubscribeProperties",
    "SubscribeTopic",
    "Unsuback",
    "UnsubackReason",
    "Unsubscribe",
    "UnsubscribeProperties",
    "Will",
    "WillProperties",
    "encode",
    "encode_puback",
    "encode_pubacks",
    "encode_pubcomp",
    "encode_publish",
    "encode_pubrec",
    "encode_pubrel",
]
