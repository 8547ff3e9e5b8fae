"""What a competing-consumer worker hands its handler and does when it fails:
`Batch`, `Guarantee`, `ErrorPolicy` (`OnError`, `Failure`), and `load_handler`
for a handler named `package.module:function` (docs: `riverbed.subscriptions.workers`,
which runs them).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import cast

from riverbed.errors import InvalidInput, RiverbedError
from riverbed.model import StoredMessage, StreamId
from riverbed.storage.transactions import Transaction


class Guarantee(Enum):
    """How often a message's effect happens; see the module docstring."""

    AT_LEAST_ONCE = "at-least-once"
    EXACTLY_ONCE = "exactly-once"


class OnError(Enum):
    """What a worker does when its handler raises."""

    STOP = "stop"
    RETRY = "retry"
    SKIP = "skip"


@dataclass(frozen=True, slots=True)
class Batch:
    """Up to `batch_size` messages of one stream, in offset order.

    `messages` are those the subscription's filter matches; `start` and `end` are
    the offsets the batch covers (`end` is the position recorded once it is
    handled), filtered-out messages included.
    """

    subscription: str
    stream: StreamId
    messages: Sequence[StoredMessage]
    start: int
    end: int
    attempt: int
    """1 for the first try, 2 for the first retry, ..."""
    transaction: Transaction | None = None

    @property
    def tx(self) -> Transaction:
        """The transaction that records this batch's position (EXACTLY_ONCE only)."""
        if self.transaction is None:
            raise RiverbedError(
                "batch.tx exists only for a worker with guarantee=EXACTLY_ONCE"
                " (riverbed worker --exactly-once): at least once, the handler runs"
                " before the position's transaction begins"
            )
        return self.transaction


@dataclass(frozen=True, slots=True)
class Failure:
    """A batch the worker gives up on, as handed to `ErrorPolicy.on_failure`."""

    batch: Batch
    error: Exception
    attempts: int
    action: OnError
    """What happens after the hook: SKIP (the position moves past the batch in
    `tx`) or STOP (the worker stops, the position stays)."""
    tx: Transaction
    """The transaction that records the skip: the hook's writes commit with it."""


Handler = Callable[[Batch], object]
FailureHook = Callable[[Failure], object]


@dataclass(frozen=True, slots=True)
class ErrorPolicy:
    """What to do when the handler raises; see the module docstring."""

    action: OnError = OnError.STOP
    max_attempts: int | None = None
    """RETRY: attempts in all, the first included (None: until it succeeds)."""
    backoff: float = 0.5
    """RETRY: seconds before the first retry, doubling each time..."""
    max_backoff: float = 30.0
    """... up to this."""
    give_up: OnError = OnError.STOP
    """RETRY, after `max_attempts`: STOP or SKIP."""
    on_failure: FailureHook | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.action, OnError):
            raise InvalidInput(f"on-error action {self.action!r} must be one of stop, retry, skip")
        if self.give_up not in (OnError.STOP, OnError.SKIP):
            raise InvalidInput(f"give-up action {self.give_up!r} must be stop or skip")
        if self.max_attempts is not None and (
            not isinstance(self.max_attempts, int)
            or isinstance(self.max_attempts, bool)
            or self.max_attempts < 1
        ):
            raise InvalidInput(f"max attempts {self.max_attempts!r} must be an integer >= 1")
        for name, value in (("backoff", self.backoff), ("max backoff", self.max_backoff)):
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"{name} {value!r}s must be a number >= 0")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt`."""
        return float(min(self.max_backoff, self.backoff * 2 ** min(attempt - 1, 60)))

    def final_action(self) -> OnError:
        return self.give_up if self.action is OnError.RETRY else self.action


def load_handler(spec: str) -> Handler:
    """The callable `package.module:function` names (`function` may be dotted).

    Raises `InvalidInput` saying what is wrong with `spec`.
    """
    module_name, sep, attribute = spec.partition(":") if isinstance(spec, str) else ("", "", "")
    if not sep or not module_name or not attribute:
        raise InvalidInput(f"handler {spec!r} is not MODULE:FUNCTION, e.g. myapp.handlers:on_order")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InvalidInput(f"handler {spec!r}: no module named {exc.name!r}") from None
    except Exception as exc:
        raise InvalidInput(f"handler {spec!r}: importing {module_name!r} raised {exc!r}") from exc
    target: object = module
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise InvalidInput(
                f"handler {spec!r}: module {module_name!r} has no attribute {attribute!r}"
            ) from None
    if not callable(target):
        raise InvalidInput(f"handler {spec!r} is a {type(target).__name__}, not a callable")
    return cast(Handler, target)
