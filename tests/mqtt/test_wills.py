"""The Will as the session record keeps it: every field comes back."""

from __future__ import annotations

from riverbed.mqtt.codec import Will, WillProperties
from riverbed.mqtt.wills import will_from_json, will_publish, will_to_json


def test_will_round_trips_through_the_record() -> None:
    will = Will(
        "a/b",
        b"\x00\xffbye",
        2,
        True,
        WillProperties(
            will_delay_interval=30,
            payload_format_indicator=1,
            message_expiry_interval=60,
            content_type="text/plain",
            response_topic="r/t",
            correlation_data=b"\x01",
            user_properties=(("k", "v"), ("k", "w")),
        ),
    )
    assert will_from_json(will_to_json(will, "alice")) == (will, "alice")
    assert will_from_json(will_to_json(Will("t"), None)) == (Will("t"), None)


def test_will_publish_carries_the_properties_but_not_the_delay() -> None:
    publish = will_publish(Will("t", b"x", 1, False, WillProperties(will_delay_interval=5)))
    assert (publish.topic, publish.payload, publish.qos, publish.retain) == ("t", b"x", 1, False)
    assert publish.properties.message_expiry_interval is None
