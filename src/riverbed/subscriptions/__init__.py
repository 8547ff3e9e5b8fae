"""Named subscriptions: durable cursors over a topic's streams."""

from riverbed.subscriptions.named import Consumer, Delivery, StreamLag, Subscriptions

__all__ = ["Consumer", "Delivery", "StreamLag", "Subscriptions"]
