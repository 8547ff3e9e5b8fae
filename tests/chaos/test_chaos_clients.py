"""The chaos run's MQTT client (bench/_chaos_clients.py) keeps a QoS 2
message's owed PUBLISH RELEASE across reconnects: paho 2.2 alone turns it
back into a PUBLISH when a reconnect fails before its CONNACK."""

from __future__ import annotations

import sys
from pathlib import Path

import paho.mqtt.client as paho

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from _chaos_clients import _client


def _awaiting_pubcomp(client: paho.Client) -> paho.MQTTMessage:
    client._clean_start = False  # what connect(clean_start=False) sets
    client.publish("chaos/p0", b"p0.k0.0", 2)  # not connected: kept to send later
    (message,) = client._out_messages.values()
    message.state = paho.mqtt_ms_wait_for_pubcomp  # PUBREC came, PUBREL sent
    return message


def test_a_pubrel_stays_owed_across_two_reconnects_without_a_connack() -> None:
    client = _client("chaos-test")
    message = _awaiting_pubcomp(client)
    client._messages_reconnect_reset_out()
    assert message.state == paho.mqtt_ms_resend_pubrel
    client._messages_reconnect_reset_out()  # that connection never got its CONNACK
    assert message.state == paho.mqtt_ms_resend_pubrel


def test_a_message_awaiting_pubrec_is_still_published_again() -> None:
    client = _client("chaos-test")
    message = _awaiting_pubcomp(client)
    message.state = paho.mqtt_ms_wait_for_pubrec
    client._messages_reconnect_reset_out()
    client._messages_reconnect_reset_out()
    assert message.state == paho.mqtt_ms_publish
    assert message.dup
