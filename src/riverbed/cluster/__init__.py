"""What broker nodes sharing one PostgreSQL database say to each other.

`bus`: messages between nodes over PostgreSQL LISTEN/NOTIFY: `PostgresBus`
carries the shared subscriptions' Borrower <-> Leader messages to addresses
on other nodes, `NodeBus` messages to a node by name (session takeover,
`mqtt/broker.py`) and each node's presence (its listening connection).
"""
