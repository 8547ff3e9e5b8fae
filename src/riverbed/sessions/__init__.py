"""Persistent MQTT sessions over the log (seed 002, docs/broker.md).

`session.Session` is the sans-I/O state machine of one online session: what it
subscribes to, which streams it follows and how far, what is in flight.
`store.SessionStore` keeps the durable part: a KV record per client id written
with compare-and-set, and a cursor per (session, topic) as a named subscription.
Nothing here knows MQTT packets: `riverbed.mqtt` turns packets into these plain
values and back.
"""
