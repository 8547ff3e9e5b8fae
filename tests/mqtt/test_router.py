"""The live router's answers to sessions' fetches (mqtt/router.py), in process."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence
from typing import Any

from riverbed.log.log import Log
from riverbed.model import Message, StoredMessage
from riverbed.mqtt.router import READ_AHEAD, Router
from riverbed.topics.trie import TopicTrie


class CountingStorage:
    """Passes everything to a real storage, counting `read` calls."""

    def __init__(self, storage: Any) -> None:
        self._storage = storage
        self.reads = 0

    def read(self, key: int, offset: int, limit: int) -> list[StoredMessage]:
        self.reads += 1
        return self._storage.read(key, offset, limit)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


def test_a_replaying_session_is_served_from_one_read_ahead(sqlite_url: str) -> None:
    log = Log.open(sqlite_url)
    try:
        log.topics.create("r", 1)
        log.produce("r", [Message(b"%d" % i, key="k", mqtt_topic="a") for i in range(2500)])
        (head,) = log.storage.list_streams("r")
        storage = CountingStorage(log.storage)

        async def replay() -> list[tuple[int, int, int]]:
            trie: TopicTrie[Hashable] = TopicTrie()
            router = Router(storage, trie, buffer_size=16)  # type: ignore[arg-type]
            await router.start()
            answers: list[tuple[int, int, int]] = []
            offset = 0
            try:
                while offset < 2500:
                    done = asyncio.get_running_loop().create_future()

                    def sink(
                        key: int,
                        rows: Sequence[StoredMessage],
                        upto: int,
                        done: asyncio.Future[Any] = done,
                    ) -> None:
                        done.set_result((rows, upto))

                    router.fetch(head.key, offset, 62, "session", sink)
                    rows, upto = await done
                    assert [r.offset for r in rows] == list(range(offset, upto))
                    answers.append((offset, len(rows), upto))
                    offset = upto
            finally:
                await router.stop()
            return answers

        answers = asyncio.run(replay())
        assert sum(n for _, n, _ in answers) == 2500
        # One storage read per READ_AHEAD rows, not one per fetch of 62.
        assert storage.reads <= (2500 + READ_AHEAD - 1) // READ_AHEAD
    finally:
        log.close()
