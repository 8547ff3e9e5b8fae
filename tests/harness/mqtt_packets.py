"""Hypothesis strategies for valid MQTT packets, per protocol level.

`packets(level)` draws any packet that `encode(packet, level)` accepts: at
level 4 (MQTT 3.1.1) without properties, with success reason codes and the
3.1.1 subset of everything else; at level 5 with every property a packet may
carry. Property values come from `PropertySpec`s, so a property added to the
codec is generated here without a change.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from riverbed.mqtt.codec import (
    CONNACK_RETURN_CODES,
    AckProperties,
    Auth,
    AuthProperties,
    AuthReason,
    Connack,
    ConnackProperties,
    Connect,
    ConnectProperties,
    ConnectReason,
    Disconnect,
    DisconnectProperties,
    DisconnectReason,
    Packet,
    Pingreq,
    Pingresp,
    Puback,
    PubackReason,
    Pubcomp,
    PubcompReason,
    Publish,
    PublishProperties,
    Pubrec,
    PubrecReason,
    Pubrel,
    PubrelReason,
    RetainHandling,
    Suback,
    SubackReason,
    Subscribe,
    SubscribeProperties,
    SubscribeTopic,
    Unsuback,
    UnsubackReason,
    Unsubscribe,
    UnsubscribeProperties,
    Will,
    WillProperties,
)
from riverbed.mqtt.codec.properties import PropertySpec
from riverbed.mqtt.codec.reasons import SUBACK_REASONS_V311

MAX_VBI = 268_435_455

# Any code point but U+0000 [MQTT-1.5.4-2] and surrogates [MQTT-1.5.4-1].
TEXT_CHARS = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
texts = st.text(TEXT_CHARS, max_size=12)
LEVEL_CHARS = st.characters(exclude_categories=("Cs",), exclude_characters="\x00/+#")
levels = st.one_of(
    st.sampled_from(["a", "b", "$SYS", "", "sensors", "ü", "𪛔"]), st.text(LEVEL_CHARS, max_size=6)
)
blobs = st.binary(max_size=24)
packet_ids = st.integers(1, 65535)


@st.composite
def topic_names(draw: st.DrawFn) -> str:
    """A valid topic name: at least one character, no wildcards [MQTT-4.7]."""
    name = "/".join(draw(st.lists(levels, min_size=1, max_size=4)))
    return name or draw(st.sampled_from(["/", "a"]))


@st.composite
def topic_filters(draw: st.DrawFn, shared: bool = True) -> str:
    """A valid topic filter, sometimes `$share/NAME/...` [MQTT-4.7.1], [MQTT-4.8.2]."""
    parts = draw(st.lists(st.one_of(levels, st.just("+")), min_size=1, max_size=4))
    if draw(st.booleans()):
        parts.append("#")
    text = "/".join(parts) or "#"
    if shared and draw(st.integers(0, 4)) == 0:
        share_name = draw(st.text(LEVEL_CHARS, min_size=1, max_size=5))
        text = f"$share/{share_name}/{text}"
    return text


def _value(spec: PropertySpec) -> st.SearchStrategy[Any]:
    kind = spec.kind
    if kind == "str":
        return texts
    if kind == "topic":
        return topic_names()
    if kind == "bin":
        return blobs
    if kind == "pair":
        return st.tuples(texts, texts)
    if kind == "bool":
        return st.booleans()
    high = spec.high or {"byte": 255, "u16": 65535, "u32": 2**32 - 1, "vbi": MAX_VBI}[kind]
    return st.one_of(st.integers(spec.low, high), st.sampled_from([spec.low, high]))


def properties(cls: type[Any]) -> st.SearchStrategy[Any]:
    """Any properties object of `cls`, each property present or absent."""
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for spec in cls.SPECS:
        value = _value(spec)
        optional[spec.attr] = st.lists(value, max_size=3).map(tuple) if spec.repeatable else value
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: cls(**values))


def _props(level: int, cls: type[Any]) -> st.SearchStrategy[Any]:
    return properties(cls) if level == 5 else st.just(cls())


def _reason(level: int, enum: type[Any]) -> st.SearchStrategy[Any]:
    return st.sampled_from(list(enum)) if level == 5 else st.just(enum(0))


@st.composite
def connects(draw: st.DrawFn, level: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_names()),
            draw(blobs),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(_props(level, WillProperties)),
        )
    props = draw(_props(level, ConnectProperties))
    if props.authentication_data is not None and props.authentication_method is None:
        props = ConnectProperties(**{**_fields(props), "authentication_method": "m"})
    username = draw(st.none() | texts)
    password = draw(st.none() | blobs)
    client_id = draw(texts)
    clean_start = draw(st.booleans())
    if level == 4:
        if username is None:
            password = None  # 3.1.1 [MQTT-3.1.2-22]
        if not client_id:
            clean_start = True  # 3.1.1 [MQTT-3.1.3-7]
    keep_alive = draw(st.integers(0, 65535))
    return Connect(client_id, clean_start, keep_alive, username, password, will, props)


def _fields(obj: Any) -> dict[str, Any]:
    return {spec.attr: getattr(obj, spec.attr) for spec in obj.SPECS}


@st.composite
def connacks(draw: st.DrawFn, level: int) -> Connack:
    if level == 5:
        reason = draw(st.sampled_from(list(ConnectReason)))
    else:
        reason = draw(st.sampled_from(list(CONNACK_RETURN_CODES.values())))
    present = draw(st.booleans()) and reason == ConnectReason.SUCCESS
    return Connack(present, reason, draw(_props(level, ConnackProperties)))


@st.composite
def publishes(draw: st.DrawFn, level: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(_props(level, PublishProperties))
    topic = draw(topic_names())
    if props.topic_alias is not None and draw(st.booleans()):
        topic = ""  # a Topic Alias stands for the name (MQTT 5.0 §3.3.2.3.4)
    payload = draw(st.one_of(blobs, st.binary(min_size=100, max_size=400)))
    return Publish(
        topic,
        payload,
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_ids) if qos else None,
        props,
    )


@st.composite
def subscribe_topics(draw: st.DrawFn, level: int) -> SubscribeTopic:
    topic_filter = draw(topic_filters())
    qos = draw(st.integers(0, 2))
    if level == 4:
        return SubscribeTopic(topic_filter, qos)
    shared = topic_filter.startswith("$share/")
    return SubscribeTopic(
        topic_filter,
        qos,
        False if shared else draw(st.booleans()),
        draw(st.booleans()),
        draw(st.sampled_from(list(RetainHandling))),
    )


def subscribes(level: int) -> st.SearchStrategy[Subscribe]:
    return st.builds(
        Subscribe,
        packet_ids,
        st.lists(subscribe_topics(level), min_size=1, max_size=4).map(tuple),
        _props(level, SubscribeProperties),
    )


def subacks(level: int) -> st.SearchStrategy[Suback]:
    reasons = list(SubackReason) if level == 5 else sorted(SUBACK_REASONS_V311)
    return st.builds(
        Suback,
        packet_ids,
        st.lists(st.sampled_from(reasons), min_size=1, max_size=4).map(tuple),
        _props(level, AckProperties),
    )


def unsubscribes(level: int) -> st.SearchStrategy[Unsubscribe]:
    return st.builds(
        Unsubscribe,
        packet_ids,
        st.lists(topic_filters(), min_size=1, max_size=4).map(tuple),
        _props(level, UnsubscribeProperties),
    )


def unsubacks(level: int) -> st.SearchStrategy[Unsuback]:
    if level == 4:
        return st.builds(Unsuback, packet_ids)
    return st.builds(
        Unsuback,
        packet_ids,
        st.lists(st.sampled_from(list(UnsubackReason)), min_size=1, max_size=4).map(tuple),
        properties(AckProperties),
    )


def acks(level: int) -> st.SearchStrategy[Packet]:
    return st.one_of(
        *(
            st.builds(cls, packet_ids, _reason(level, reason), _props(level, AckProperties))
            for cls, reason in (
                (Puback, PubackReason),
                (Pubrec, PubrecReason),
                (Pubrel, PubrelReason),
                (Pubcomp, PubcompReason),
            )
        )
    )


@st.composite
def auths(draw: st.DrawFn) -> Auth:
    props = draw(properties(AuthProperties))
    if props.authentication_method is None:
        props = AuthProperties(**{**_fields(props), "authentication_method": draw(texts)})
    return Auth(draw(st.sampled_from(list(AuthReason))), props)


def packets(level: int) -> st.SearchStrategy[Packet]:
    """Any packet `encode(packet, level)` accepts."""
    choices: list[st.SearchStrategy[Any]] = [
        connects(level),
        connacks(level),
        publishes(level),
        acks(level),
        subscribes(level),
        subacks(level),
        unsubscribes(level),
        unsubacks(level),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.builds(
            Disconnect, _reason(level, DisconnectReason), _props(level, DisconnectProperties)
        ),
    ]
    if level == 5:
        choices.append(auths())
    return st.one_of(*choices)


def after_connect(level: int) -> st.SearchStrategy[Packet]:
    """Any packet but a CONNECT: what a server-side decoder accepts after the first one."""
    return packets(level).filter(lambda packet: not isinstance(packet, Connect))
