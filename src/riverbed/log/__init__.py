"""The log: topics of storage topics, the router, group commit, readers, retention."""
