"""MQTT topic names and filters: validation, matching, overlap, and a trie."""

from riverbed.topics.filters import (
    filter_covers,
    filters_overlap,
    matches,
    validate_filter,
    validate_topic_name,
)

__all__ = ["filter_covers", "filters_overlap", "matches", "validate_filter", "validate_topic_name"]
