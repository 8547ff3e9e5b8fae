"""Delivering one shard's batch (issue 7): the ungrouped case.

An ungrouped subscription delivers its messages in parallel, whatever their
group: `deliver_batch` makes one attempt for each item, at most
`max_in_flight` at a time, and sorts the results — delivered; to the retry
queue (a retryable failure with attempts left: `QueuedMessage` for the next
attempt, due after the policy's backoff); parked in the dead-letter queue (a
permanent failure, or the attempts ran out). The caller writes the queue
records and commits the shard's progress (docs/delivery.md, next steps).
Grouped order (`groups.py`) builds on the same attempt and classification.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from riverbed.model import StoredMessage
from riverbed.subscriptions.definition import DeliveryDefinition
from riverbed.subscriptions.endpoint import Attempt, Deliverer, Outcome
from riverbed.subscriptions.queues import QueuedMessage


@dataclass(frozen=True, slots=True)
class Item:
    """A message to attempt, with where it comes from in the main topic."""

    message: StoredMessage
    main_topic_idx: int
    main_partition: int
    attempt: int = 1

    @property
    def main_offset(self) -> int:
        return self.message.offset


@dataclass(slots=True)
class BatchResult:
    delivered: list[Item] = field(default_factory=list)
    retry: list[QueuedMessage] = field(default_factory=list)
    parked: list[QueuedMessage] = field(default_factory=list)


def _queued(
    item: Item, attempt: Attempt, next_attempt: int, due_us: int, now: int
) -> QueuedMessage:
    m = item.message
    return QueuedMessage(
        m.message_id,
        item.main_topic_idx,
        item.main_partition,
        item.main_offset,
        next_attempt,
        due_us,
        now,
        attempt.reason,
        m.key,
        m.payload,
        m.mqtt_topic,
        m.properties,
        m.qos,
        bool(m.retain),
    )


async def deliver_batch(
    items: Sequence[Item],
    deliverer: Deliverer,
    definition: DeliveryDefinition,
    now_us: Callable[[], int],
) -> BatchResult:
    """One attempt per item, `max_in_flight` at a time; the results sorted."""
    slots = asyncio.Semaphore(definition.consumption.max_in_flight)

    async def attempt(item: Item) -> Attempt:
        async with slots:
            return await deliverer.deliver(item.message, item.attempt)

    attempts = await asyncio.gather(*(attempt(item) for item in items))
    retry = definition.retry
    out = BatchResult()
    now = now_us()
    for item, result in zip(items, attempts, strict=True):
        if result.outcome is Outcome.DELIVERED:
            out.delivered.append(item)
        elif result.outcome is Outcome.RETRY and item.attempt < retry.max_attempts:
            due = now + int(retry.delay(item.attempt) * 1_000_000)
            out.retry.append(_queued(item, result, item.attempt + 1, due, now))
        else:
            out.parked.append(_queued(item, result, item.attempt + 1, now, now))
    return out
