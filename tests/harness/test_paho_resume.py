"""paho-mqtt's QoS 2 resume across a failed reconnect attempt, and the
harness's `PahoClient` that keeps it right (the crash tests' publishers).

A QoS 2 message whose PUBREL paho sent must be resumed with the PUBREL, never
with the PUBLISH again (MQTT 5 §4.3.3: the sender "MUST NOT re-send the
PUBLISH once it has sent the corresponding PUBREL"): the broker has released the packet id and would
store a resent PUBLISH as a new message. paho-mqtt 2.2.0 resets its messages at
every reconnect attempt, and a second reset (the first attempt failed: the broker
was still restarting) turns "resend the PUBREL" into "send the PUBLISH". Seen as
one QoS 2 message stored twice in `tests/mqtt/test_broker_qos2.py`'s crash test,
when the killed broker took over a second to listen again.
"""

from __future__ import annotations

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from harness.broker import PahoClient


def owed_a_pubrel(client: paho.Client) -> paho.MQTTMessage:
    """A QoS 2 message in `client` whose PUBREC came and PUBREL went out."""
    message = paho.MQTTMessage(mid=7, topic=b"k/1")
    message.qos = 2
    message.state = paho.mqtt_ms_wait_for_pubcomp
    client._out_messages[7] = message
    return message


def test_paho_publishes_again_after_two_resets() -> None:
    # What the harness works around: if this starts failing, paho fixed it and
    # `PahoClient` can go.
    client = paho.Client(CallbackAPIVersion.VERSION2, "plain", protocol=paho.MQTTv5)
    client._clean_start = False
    message = owed_a_pubrel(client)
    client._messages_reconnect_reset_out()
    assert message.state == paho.mqtt_ms_resend_pubrel
    client._messages_reconnect_reset_out()  # the first attempt failed
    assert message.state == paho.mqtt_ms_publish


def test_the_harness_client_resends_the_pubrel_whatever_the_resets() -> None:
    client = PahoClient(CallbackAPIVersion.VERSION2, "fixed", protocol=paho.MQTTv5)
    client._clean_start = False
    message = owed_a_pubrel(client)
    waiting = paho.MQTTMessage(mid=8, topic=b"k/1")
    waiting.qos = 2
    waiting.state = paho.mqtt_ms_wait_for_pubrec
    client._out_messages[8] = waiting
    for _ in range(3):
        client._messages_reconnect_reset_out()
        assert message.state == paho.mqtt_ms_resend_pubrel
        # One whose PUBREC never came is published again, as paho does.
        assert waiting.state == paho.mqtt_ms_publish
