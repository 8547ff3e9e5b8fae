"""What broker nodes sharing one PostgreSQL database say to each other.

`bus`: messages between nodes over PostgreSQL LISTEN/NOTIFY (the shared
subscriptions' Borrowers and Leaders).
"""
