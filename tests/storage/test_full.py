"""A size cap on SQLite (`?max_size=`) and what a full store raises (docs/storage.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from riverbed.errors import InvalidConfig, StorageFull
from riverbed.log.log import Log
from riverbed.model import Message
from riverbed.storage import open_storage


@pytest.mark.parametrize(
    ("size", "rule"),
    [("lots", "is not a size"), ("12XB", "is not a size"), ("1kB", "is below the least size")],
)
def test_a_bad_max_size_is_refused(tmp_path: Path, size: str, rule: str) -> None:
    path = tmp_path / "db.sqlite"
    with pytest.raises(InvalidConfig, match=rf"max_size '{size}' {rule}"):
        open_storage(f"sqlite:///{path}?max_size={size}")
    assert not path.exists()  # nothing created


def test_a_full_database_raises_storage_full_and_takes_writes_when_space_returns(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path}/db.sqlite"
    with Log(open_storage(f"{url}?max_size=256KiB")) as log:
        log.topics.create("t", 1, retention_us=None)
        batch = [Message(b"x" * 1000, key="k")] * 10
        written = 0
        with pytest.raises(StorageFull, match="database or disk is full"):
            while True:
                log.produce("t", batch)
                written += len(batch)
        assert 0 < written < 256
        (head,) = log.storage.list_streams("t")
        assert head.next_offset == written  # the refused batch left no trace
        with pytest.raises(StorageFull):
            log.produce("t", batch)
        assert log.appender.refusals.refusing is not None
        assert log.storage.delete_before(head.key, written) == written
        log.produce("t", batch)  # the same writer, on by itself
        assert log.appender.refusals.refusing is None
        assert log.appender.refusals.episodes == 1
