"""Will Messages (MQTT 5.0 §3.1.2.5, §3.1.3.2).

A connection that closes without DISCONNECT 0x00 (or with 0x04 Disconnect with
Will Message) leaves its Will to this broker's `Wills`: published after the
Will Delay Interval or when the session ends, whichever comes first
[MQTT-3.1.3-9]; a new connection to the session before then cancels it, and a
clean start (which ends the old session) publishes it at once. MQTT 3.1.1 has
no delay. The Will is published like a PUBLISH from its client: authorized for
its topic, retained if it asks to be (and retain is available), with its QoS.

Durable: the Will is in the session record (`SessionRecord.will`) from CONNECT
until a DISCONNECT 0x00 or until it is published. A broker that starts finds
the Wills its predecessor left pending (or that a crash left behind: a record
still marked connected) and publishes them when they are due. A crash between
publishing a Will and clearing it publishes it again: at least once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from dataclasses import replace

from riverbed.errors import PreconditionFailed, RiverbedError
from riverbed.mqtt.codec import Publish, PublishProperties, Will, WillProperties
from riverbed.mqtt.messages import committed_row, message_from_publish
from riverbed.mqtt.ports import Services
from riverbed.mqtt.sys import is_sys_topic
from riverbed.sessions.store import NEVER_EXPIRES, now_us

log = logging.getLogger(__name__)


def will_publish(will: Will) -> Publish:
    """The PUBLISH a Will stands for (its properties, the delay aside)."""
    props = will.properties
    return Publish(
        will.topic,
        will.payload,
        will.qos,
        will.retain,
        packet_id=1 if will.qos else None,  # a PUBLISH's needs one; never sent
        properties=PublishProperties(
            payload_format_indicator=props.payload_format_indicator,
            message_expiry_interval=props.message_expiry_interval,
            response_topic=props.response_topic,
            correlation_data=props.correlation_data,
            user_properties=props.user_properties,
            content_type=props.content_type,
        ),
    )


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def will_to_json(will: Will, username: str | None) -> str:
    """The Will (and who may publish it) as the session record keeps it."""
    p = will.properties
    return json.dumps(
        {
            "topic": will.topic,
            "payload": _b64(will.payload),
            "qos": will.qos,
            "retain": will.retain,
            "username": username,
            "delay": p.will_delay_interval,
            "format": p.payload_format_indicator,
            "expiry": p.message_expiry_interval,
            "content_type": p.content_type,
            "response_topic": p.response_topic,
            "correlation": _b64(p.correlation_data),
            "user": [list(pair) for pair in p.user_properties],
        },
        separators=(",", ":"),
    )


def will_from_json(text: str) -> tuple[Will, str | None]:
    data = json.loads(text)
    correlation = data["correlation"]
    props = WillProperties(
        will_delay_interval=data["delay"],
        payload_format_indicator=data["format"],
        message_expiry_interval=data["expiry"],
        content_type=data["content_type"],
        response_topic=data["response_topic"],
        correlation_data=None if correlation is None else base64.b64decode(correlation),
        user_properties=tuple((k, v) for k, v in data["user"]),
    )
    will = Will(
        data["topic"], base64.b64decode(data["payload"]), data["qos"], data["retain"], props
    )
    return will, data["username"]


class Wills:
    """The Wills waiting for their delay, by client id."""

    def __init__(self, broker: Services) -> None:
        self.broker = broker
        self._pending: dict[str, tuple[asyncio.TimerHandle, str | None, Will]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def schedule(self, client_id: str, username: str | None, will: Will, delay: float) -> None:
        """Publish `will` in `delay` seconds unless the client comes back first."""
        self.cancel(client_id)
        loop = asyncio.get_running_loop()
        handle = loop.call_later(max(delay, 0.0), self._fire, client_id)
        self._pending[client_id] = (handle, username, will)
        if delay <= 0:
            # Now, not on a later turn: a connection taking this one over must not
            # cancel a Will without delay (MQTT 5.0 §3.1.4, takeover).
            handle.cancel()
            self._fire(client_id)

    def cancel(self, client_id: str) -> bool:
        """The client reconnected to its session: its Will is not sent [MQTT-3.1.3-9]."""
        pending = self._pending.pop(client_id, None)
        if pending is None:
            return False
        pending[0].cancel()
        return True

    def fire_now(self, client_id: str) -> None:
        """The session ended (a clean start): publish a pending Will now."""
        if client_id in self._pending:
            self._pending[client_id][0].cancel()
            self._fire(client_id)

    def _fire(self, client_id: str) -> None:
        pending = self._pending.pop(client_id, None)
        if pending is None:
            return
        _handle, username, will = pending
        task = asyncio.get_running_loop().create_task(self.publish(client_id, username, will))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def restore(self) -> None:
        """At start: schedule the Wills that stored sessions still hold (their
        broker stopped or crashed before publishing them)."""
        broker = self.broker
        at = now_us()
        for stored in await asyncio.to_thread(broker.store.all):
            record = stored.record
            if record.will is None or record.client_id in broker.connections:
                continue
            will, username = will_from_json(record.will)
            since = record.disconnected_us if record.disconnected_us is not None else record.seen_us
            delay = will.properties.will_delay_interval or 0
            if record.expiry_interval != NEVER_EXPIRES:
                delay = min(delay, record.expiry_interval)
            due_in = (since + delay * 1_000_000 - at) / 1_000_000
            log.info("client %s: will pending from before the start", record.client_id)
            self.schedule(record.client_id, username, will, due_in)

    async def publish(self, client_id: str, username: str | None, will: Will) -> None:
        """Commit the Will like a PUBLISH from `client_id`, route it, and clear
        it from the session record."""
        await self._publish(client_id, username, will)
        try:
            await asyncio.to_thread(self._clear, client_id, will_to_json(will, username))
        except RiverbedError:
            log.exception("client %s: clearing its published will failed", client_id)

    def _clear(self, client_id: str, will: str) -> None:
        store = self.broker.store
        stored = store.load(client_id)
        if stored is None or stored.record.will != will or stored.record.connected:
            return  # gone, or a new connection holds the session now
        with contextlib.suppress(PreconditionFailed):
            store.write(replace(stored.record, will=None), stored.version)

    async def _publish(self, client_id: str, username: str | None, will: Will) -> None:
        broker = self.broker
        if is_sys_topic(will.topic) or not broker.authorizer.can_publish(
            username, client_id, will.topic
        ):
            # Like its PUBLISH would be (mqtt/inbound.py): $SYS is the broker's.
            log.info("client %s: not authorized to publish its will to %r", client_id, will.topic)
            return
        try:
            log_topic, key_mode = broker.log.route(will.topic)
            message = message_from_publish(will_publish(will), will.topic, client_id, key_mode)
            if will.retain and broker.config.limits.retain_available:
                await asyncio.to_thread(broker.retained.put, message, now_us())
            positions = await asyncio.wrap_future(broker.log.produce_async(log_topic, [message]))
        except Exception:
            log.exception("client %s: publishing its will failed", client_id)
            return
        stream, offset = positions[0]
        broker.router.committed(stream, offset, [committed_row(message, offset)])
        log.info("client %s: will published to %r", client_id, will.topic)
