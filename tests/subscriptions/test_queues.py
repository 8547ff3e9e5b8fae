"""Retry and dead-letter queue messages (issue 7): what is written reads back
the same, through properties and through the real log on both backends."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from riverbed.errors import InvalidInput
from riverbed.log.log import Log
from riverbed.model import MessageId, StoredMessage, encode_properties
from riverbed.subscriptions.queues import QueuedMessage

ids = st.builds(
    MessageId.compose,
    st.integers(0, 2**40),
    st.integers(0, 1023),
    st.integers(0, 4095),
)
queued = st.builds(
    QueuedMessage,
    message_id=ids,
    main_topic_idx=st.integers(0, 10),
    main_partition=st.integers(0, 64),
    main_offset=st.integers(0, 2**40),
    attempt=st.integers(1, 100),
    due_us=st.integers(0, 2**60),
    failed_us=st.integers(0, 2**60),
    reason=st.text(max_size=50),
    key=st.none() | st.text(min_size=1, max_size=20),
    payload=st.binary(max_size=100),
    mqtt_topic=st.sampled_from(["", "orders/new", "a/é/b"]),
    properties=st.lists(
        st.tuples(st.sampled_from(["user", "riverbed.note", "x"]), st.text(max_size=10)),
        max_size=3,
    ).map(tuple),
    qos=st.integers(0, 2),
    retain=st.booleans(),
)


def stored(message: QueuedMessage, offset: int = 0) -> StoredMessage:
    m = message.to_message()
    return StoredMessage(
        offset,
        MessageId.compose(1, 1, 1).to_bytes(),
        0,
        m.mqtt_topic,
        m.key,
        m.payload,
        encode_properties(m.properties),
        m.qos,
        int(m.retain),
    )


@given(queued)
def test_a_queued_message_reads_back_the_same(message: QueuedMessage) -> None:
    assert QueuedMessage.from_stored(stored(message)) == message


def test_through_the_log(storage_url: str) -> None:
    message = QueuedMessage(
        MessageId.compose(1_700_000_000_000_000, 3, 7),
        1,
        5,
        42,
        2,
        10,
        9,
        "HTTP 503",
        "customer-1",
        b"body",
        "orders/new",
        (("user", "v"),),
        1,
        False,
    )
    with Log.open(storage_url) as log:
        log.topics.create("billing.rq", 4)
        log.produce("billing.rq", [message.to_message()])
        (head,) = [h for h in log.storage.list_streams("billing.rq") if h.next_offset]
        (row,) = log.storage.read(head.key, 0, 10)
    assert QueuedMessage.from_stored(row) == message


def test_a_row_not_written_by_a_subscription_is_refused() -> None:
    plain = StoredMessage(3, b"\0" * 16, 0, "t", "k", b"", None, 0, 0)
    with pytest.raises(InvalidInput, match=r"offset 3 lacks riverbed\.id"):
        QueuedMessage.from_stored(plain)
    others = [("riverbed." + f, 1) for f in ("main", "attempt", "due", "failed", "reason")]
    props = (("riverbed.id", "nope"), *others)
    bad = plain._replace(properties_blob=encode_properties(props))
    with pytest.raises(InvalidInput, match="malformed"):
        QueuedMessage.from_stored(bad)
