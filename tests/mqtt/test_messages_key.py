"""The ordering key of an MQTT PUBLISH, by its binding's key mode (`mqtt/messages.py`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from riverbed.log.topics import CLIENT_ID_KEY, DEFAULT_KEY_MODE, KeyKind, KeyMode
from riverbed.mqtt.codec import Publish, PublishProperties
from riverbed.mqtt.messages import KEY_PROPERTY, message_from_publish

NO_NUL = st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",))
CLIENT_IDS = st.text(NO_NUL, max_size=12)
TOPIC_NAMES = st.text(
    st.characters(blacklist_characters="\x00+#", blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)
PROPERTY_NAMES = st.sampled_from(["key", "device", "tenant", "k"])
USER_PROPERTIES = st.lists(st.tuples(PROPERTY_NAMES, st.text(NO_NUL, max_size=6)), max_size=4)
MODES = st.one_of(
    st.sampled_from([KeyMode(kind) for kind in KeyKind if kind is not KeyKind.PROPERTY]),
    st.builds(KeyMode, st.just(KeyKind.PROPERTY), PROPERTY_NAMES),
)


def publish(topic: str, user_properties: list[tuple[str, str]] | None = None) -> Publish:
    if user_properties is None:
        return Publish(topic, b"p", qos=1, packet_id=1)
    properties = PublishProperties(user_properties=tuple(user_properties))
    return Publish(topic, b"p", qos=1, packet_id=1, properties=properties)


def key_of(
    mode: KeyMode, topic: str, client_id: str, user_properties: list[tuple[str, str]] | None = None
) -> str | None:
    return message_from_publish(publish(topic, user_properties), topic, client_id, mode).key


def expected_key(
    mode: KeyMode, topic: str, client_id: str, user_properties: list[tuple[str, str]]
) -> str | None:
    """The rule as the docs state it, written out plainly."""
    explicit = [value for name, value in user_properties if name == KEY_PROPERTY]
    if explicit:
        return explicit[-1]  # the publisher's `key` wins, whatever the mode (the last one)
    if mode.kind is KeyKind.PROPERTY:
        named = [value for name, value in user_properties if name == mode.property]
        return named[-1] if named else client_id
    return {
        KeyKind.CLIENT_ID: client_id,
        KeyKind.TOPIC: topic,
        KeyKind.CLIENT_TOPIC: f"{topic}#{client_id}",
        KeyKind.NONE: None,
    }[mode.kind]


def test_each_mode_without_user_properties() -> None:
    assert key_of(KeyMode.parse("client-id"), "s/1", "dev-7") == "dev-7"
    assert key_of(KeyMode.parse("topic"), "s/1", "dev-7") == "s/1"
    assert key_of(KeyMode.parse("client-topic"), "s/1", "dev-7") == "s/1#dev-7"
    assert key_of(KeyMode.parse("none"), "s/1", "dev-7") is None
    # property:NAME without that property falls back to the client id
    assert key_of(KeyMode.parse("property:device"), "s/1", "dev-7") == "dev-7"


def test_a_named_property_is_the_key() -> None:
    props = [("tenant", "t1"), ("device", "d42")]
    assert key_of(KeyMode.parse("property:device"), "s/1", "dev-7", props) == "d42"


def test_the_key_property_overrides_every_mode_none_included() -> None:
    for text in ["client-id", "topic", "client-topic", "none", "property:device"]:
        props = [("device", "d42"), ("key", "mine")]
        assert key_of(KeyMode.parse(text), "s/1", "dev-7", props) == "mine", text


def test_the_default_for_new_topics_is_client_topic_and_old_ones_keep_client_id() -> None:
    assert str(DEFAULT_KEY_MODE) == "client-topic"
    assert str(CLIENT_ID_KEY) == "client-id"


@given(MODES, TOPIC_NAMES, CLIENT_IDS, USER_PROPERTIES)
def test_key_follows_the_rule(
    mode: KeyMode, topic: str, client_id: str, user_properties: list[tuple[str, str]]
) -> None:
    message = message_from_publish(publish(topic, user_properties), topic, client_id, mode)
    assert message.key == expected_key(mode, topic, client_id, user_properties)
    # The user properties a subscriber sees again are kept whatever the key.
    kept = [(n, v) for n, v in message.properties if not n.startswith("\x00")]
    assert kept == user_properties


@given(TOPIC_NAMES, CLIENT_IDS, TOPIC_NAMES, CLIENT_IDS)
def test_client_topic_keys_are_equal_exactly_for_the_same_pair(
    topic_a: str, client_a: str, topic_b: str, client_b: str
) -> None:
    """One (publisher, topic) pair: one key, so one stream, in order (MQTT's
    promise); two pairs never share a key by the way it is written."""
    mode = KeyMode(KeyKind.CLIENT_TOPIC)
    same = key_of(mode, topic_a, client_a) == key_of(mode, topic_b, client_b)
    assert same == ((topic_a, client_a) == (topic_b, client_b))
