"""Riverbed: a durable message bus over a partitioned, replayable log."""

__version__ = "0.1.0"
