"""Positions written as text: where a subscription starts or is reset to, and
moments in time.

    parse_start("latest")                    # StartKind.LATEST
    parse_time("2024-05-01T12:00:00Z")       # µs since the epoch
    parse_reset_target("orders/0/1=42")      # {StreamId: 42}

One parser per form, shared by the command line (`--start`, `--to`, `--since`)
and the admin HTTP API, so both accept and refuse the same text with the
same message.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from riverbed.errors import InvalidInput
from riverbed.log.jsonlines import EPOCH
from riverbed.model import StreamId
from riverbed.storage.base import StartKind
from riverbed.subscriptions.named import Start

START_FORMS = (
    "earliest (the oldest retained message), latest (only what comes next),"
    " or an ISO 8601 time such as 2024-05-01T12:00:00Z (a time without zone is UTC)"
)
RESET_FORMS = (
    "earliest (the oldest retained message), latest (past everything there is),"
    " an ISO 8601 time such as 2024-05-01T12:00:00Z (a time without zone is UTC),"
    " or offsets STREAM=OFFSET,... such as orders/0/1=42,orders/0/2=7"
)


def parse_time(text: str) -> int:
    """An ISO 8601 time as µs since the epoch; a time without a zone is UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            f"time {text!r} is not an ISO 8601 time such as 2024-05-01T12:00:00Z"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    micros = (moment - EPOCH) // timedelta(microseconds=1)
    if micros < 0:
        raise InvalidInput(f"time {text!r} is before 1970-01-01T00:00:00Z")
    return micros


def parse_offsets(text: str) -> dict[StreamId, int]:
    """`orders/0/1=42,orders/0/2=7` as {stream: offset}."""
    offsets: dict[StreamId, int] = {}
    for item in text.split(","):
        name, sep, number = item.strip().rpartition("=")
        if not sep:
            raise InvalidInput(
                f"{item!r} is not STREAM=OFFSET, e.g. orders/0/1=42 (in a list of"
                " offsets every comma-separated item is one)"
            )
        stream = StreamId.parse(name)
        if not number.isdigit():
            raise InvalidInput(f"offset {number!r} for {stream} is not an integer >= 0")
        if stream in offsets:
            raise InvalidInput(f"stream {stream} is given twice")
        offsets[stream] = int(number)
    return offsets


def parse_start(text: str, forms: str = START_FORMS) -> Start:
    """earliest, latest or an ISO 8601 time; what else it is refused with
    `forms`, the list of what is accepted."""
    if text.lower() in ("earliest", "latest"):
        return StartKind(text.lower())
    try:
        datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(f"{text!r} is not a position: use {forms}") from None
    return parse_time(text)  # a time before 1970 is refused there


def parse_reset_target(text: str) -> Start | dict[StreamId, int]:
    """What `subscription reset --to` takes: a start (`parse_start`) or offsets."""
    return parse_offsets(text) if "=" in text else parse_start(text, RESET_FORMS)
