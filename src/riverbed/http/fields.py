"""Reading request fields the CLI's way: durations, sizes, bounded bodies.

A value is parsed by the same function the command line uses, and a mistake
names the field: `in_field("retention", duration, "7x")` raises
`InvalidInput("retention: ...")`, answered 422 with nothing changed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import Request

from riverbed.errors import InvalidInput
from riverbed.http.errors import ApiError
from riverbed.model import parse_duration
from riverbed.storage import size_in_bytes


def in_field(name: str, parse: Callable[[Any], Any], value: Any) -> Any:
    """`parse(value)`, its `InvalidInput` or `ValueError` prefixed with `name`."""
    try:
        return parse(value)
    except InvalidInput as exc:
        raise InvalidInput(f"{name}: {exc}") from None
    except ValueError as exc:
        raise InvalidInput(f"{name}: {exc}") from None


def duration(value: str | None) -> int | None:
    """Microseconds of "12h", "7d", ...; None for null or "none"."""
    if value is None or value.strip().lower() == "none":
        return None
    return parse_duration(value)


def size(value: int | str | None) -> int | None:
    """Bytes per stream of 500000, "10MiB", "1GB", ...; None for null or "none"."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    size = value if isinstance(value, int) else size_in_bytes(value, "maximum size")
    if size < 1:
        raise InvalidInput(f"{value!r} must be at least 1 byte per stream (or null for no limit)")
    return size


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body; 413 once it is over `limit` bytes (read no further)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"the body is {declared} bytes; at most {limit} are accepted")
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise ApiError(413, f"the body is over {limit} bytes, the most accepted")
        chunks.append(chunk)
    return b"".join(chunks)
