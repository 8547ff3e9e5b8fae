"""The session writer on both backends: many connections' writes in one
transaction, each answered with what it wrote or why it was refused."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

import pytest

from harness.storage import create_topic, numbered_rows
from harness.waiting import DEFAULT_TIMEOUT
from riverbed.errors import (
    LentElsewhere,
    PreconditionFailed,
    StorageError,
    StorageFull,
    SubscriptionNotFound,
    TopicNotFound,
)
from riverbed.sessions.session import Subscription
from riverbed.sessions.store import SessionRecord, SessionStore, Stored, cursor_name
from riverbed.sessions.writer import NewCursors, SessionWriter, outcome_of
from riverbed.storage import Storage, open_storage

TIMEOUT = 30.0


def record(client_id: str, session_id: str = "", **changes: object) -> SessionRecord:
    base = SessionRecord(client_id, session_id or f"s-{client_id}", 5, 60, True, 1_000_000)
    return SessionRecord(**{**{f: getattr(base, f) for f in base.__slots__}, **changes})  # type: ignore[arg-type]


def answers(futures: list[Future[Stored]]) -> list[Stored | BaseException]:
    out: list[Stored | BaseException] = []
    for future in futures:
        error = future.exception(TIMEOUT)
        out.append(future.result() if error is None else error)
    return out


def test_queued_writes_share_one_transaction(storage: Storage) -> None:
    store = SessionStore(storage)
    writer = SessionWriter(store, autostart=False)
    futures = [writer.write(record(f"c{i}"), None) for i in range(50)]
    writer.start()
    written = answers(futures)
    writer.close()
    assert writer.transactions == 1
    assert writer.writes == 50
    for i, stored in enumerate(written):
        assert isinstance(stored, Stored) and stored.version == 1
        loaded = store.load(f"c{i}")
        assert loaded is not None and loaded.record == record(f"c{i}") and loaded.version == 1


def test_a_refused_write_refuses_only_itself(storage: Storage) -> None:
    store = SessionStore(storage)
    first = store.write(record("taken"), None)
    store.write(record("taken", seen_us=2), first.version)  # another connection moved it on
    writer = SessionWriter(store, autostart=False)
    futures = [
        writer.write(record("a"), None),
        writer.write(record("taken", seen_us=3), first.version),  # a late, fenced write
        writer.write(record("b"), None),
        writer.write(record("a"), None),  # created already, by the first write
    ]
    writer.start()
    a, taken, b, again = answers(futures)
    writer.close()
    assert writer.transactions == 1
    assert isinstance(a, Stored) and isinstance(b, Stored)
    assert isinstance(taken, PreconditionFailed) and "version 1" in str(taken)
    assert isinstance(again, PreconditionFailed) and "exists already" in str(again)
    loaded = store.load("taken")
    assert loaded is not None and loaded.record.seen_us == 2 and loaded.version == 2


def test_a_discard_deletes_the_record_at_its_version_only(storage: Storage) -> None:
    """In turn with the other writes, in their transaction: the record alone
    (the cursors are `SessionStore.drop_state`'s), and only if no one wrote
    it since; a refused discard deletes nothing and refuses only itself."""
    heads = create_topic(storage, "t")
    store = SessionStore(storage)
    gone = store.write(record("gone", topics=("t",)), None)
    store.ensure_cursors("s-gone", ["t"], None)
    moved = store.write(record("moved"), None)
    store.write(record("moved", seen_us=2), moved.version)  # written since
    writer = SessionWriter(store, autostart=False)
    futures = [
        writer.discard(gone),
        writer.discard(moved),
        writer.write(record("new"), None),
    ]
    writer.start()
    discarded, refused, new = answers(futures)
    writer.close()
    assert writer.transactions == 1
    assert discarded is gone and isinstance(new, Stored)
    assert isinstance(refused, PreconditionFailed) and "version 1" in str(refused)
    assert store.load("gone") is None
    loaded = store.load("moved")
    assert loaded is not None and loaded.record.seen_us == 2
    assert storage.get_cursors(cursor_name("s-gone", "t")) == {heads[0].key: 0}
    store.drop_state(gone.record)
    with pytest.raises(SubscriptionNotFound):
        storage.get_subscription(cursor_name("s-gone", "t"))


def test_a_save_then_a_discard_in_one_transaction_keeps_nothing(storage: Storage) -> None:
    heads = create_topic(storage, "t")
    store = SessionStore(storage)
    stored = store.write(record("c", topics=("t",)), None)
    store.ensure_cursors("s-c", ["t"], None)
    assert stored.version is not None
    writer = SessionWriter(store, autostart=False)
    left = record("c", topics=("t",), connected=False, disconnected_us=9)
    save = writer.commit(Stored(left, stored.version), {"t": {heads[0].key: 0}}, {})
    discard = writer.discard(Stored(left, stored.version + 1))
    writer.start()
    answers([save, discard])
    writer.close()
    assert writer.transactions == 1
    assert store.load("c") is None and store.take_resumable("c") is None


def test_new_cursors_come_with_the_record(storage: Storage) -> None:
    heads = create_topic(storage, "t", partitions=2)
    storage.append({heads[0].key: numbered_rows(3)})
    store = SessionStore(storage)
    writer = SessionWriter(store)
    subscribed = record("c", subscriptions=(Subscription("t/#", 1),), topics=("t",))
    stored = writer.write(subscribed, None, NewCursors(("t",), None, {heads[1].key: 0})).result(
        TIMEOUT
    )
    # A write refused by its compare-and-set makes no cursor either.
    refused = writer.write(record("c", "other", topics=("t",)), None, NewCursors(("t",), None))
    assert isinstance(refused.exception(TIMEOUT), PreconditionFailed)
    writer.close()
    assert stored.record == subscribed
    # At the heads, or where the SUBSCRIBE said.
    assert storage.get_cursors(cursor_name("s-c", "t")) == {heads[0].key: 3, heads[1].key: 0}
    with pytest.raises(SubscriptionNotFound):
        storage.get_subscription(cursor_name("other", "t"))


def test_new_cursors_come_with_the_topics_shape_as_read_with_them(storage: Storage) -> None:
    """What a session follows its new cursors by (`Stored.made`): the topic's
    generations and heads as the write's transaction read them, the same as
    reading them apart; here of a topic scaled up once (two generations)."""
    create_topic(storage, "g", partitions=2)
    storage.add_storage_topic("g", lambda last: (4, 2))
    storage.append({storage.list_streams("g")[1].key: numbered_rows(2)})
    writer = SessionWriter(SessionStore(storage))
    subscribed = record("c", subscriptions=(Subscription("g/#", 1),), topics=("g",))
    stored = writer.write(subscribed, None, NewCursors(("g",), None)).result(TIMEOUT)
    writer.close()
    assert stored.made is not None
    made = stored.made["g"]
    assert made.generations == storage.list_storage_topics("g")
    assert [g.generation for g in made.generations] == [0, 1]
    assert made.heads == storage.list_streams("g")
    assert len(made.heads) == 6
    assert made.committed == storage.get_cursors(cursor_name("s-c", "g"))


def test_kv_entries_come_with_the_record_and_only_with_it(storage: Storage) -> None:
    store = SessionStore(storage)
    storage.kv_put("marks", "kept", b"first")
    writer = SessionWriter(store)
    also = [("marks", "a", b"c"), ("marks", "kept", b"second")]
    writer.write(record("c"), None, also=also).result(TIMEOUT)
    # A write refused by its compare-and-set writes none of its entries.
    refused = writer.write(record("c"), None, also=[("marks", "b", b"c")])
    assert isinstance(refused.exception(TIMEOUT), PreconditionFailed)
    writer.close()
    # An entry there already stays as it was.
    assert {e.key: e.value for e in storage.kv_list("marks")} == {"a": b"c", "kept": b"first"}


def test_a_write_holding_a_key_at_an_old_version_is_refused_whole(storage: Storage) -> None:
    """`holds` (a shared group's lending keys, `sharedsub.claims.lend`): a key
    at another version refuses the write, its record and entries with it,
    and no other write of the batch."""
    store = SessionStore(storage)
    lent = storage.kv_put("lent", "s", b"x")
    storage.kv_put("lent", "moved", b"x")
    moved = storage.kv_put("lent", "moved", b"y")  # lent again: version 2
    writer = SessionWriter(store, autostart=False)
    holding = [("lent", "s", lent.version)]
    futures = [
        writer.write(record("a"), None, also=[("marks", "a", b"a")], holds=holding),
        writer.write(
            record("b"),
            None,
            also=[("marks", "b", b"b")],
            holds=[*holding, ("lent", "moved", moved.version - 1)],
        ),
        writer.write(record("c"), None, holds=[("lent", "absent", 1)]),
    ]
    writer.start()
    a, b, c = answers(futures)
    writer.close()
    assert isinstance(a, Stored)
    assert isinstance(b, LentElsewhere) and "lent/moved" in str(b)
    assert isinstance(c, LentElsewhere)
    assert [e.key for e in storage.kv_list("marks")] == ["a"]
    assert store.load("b") is None and store.load("c") is None


def test_a_write_that_fails_in_the_database_fails_alone(storage: Storage) -> None:
    (head,) = create_topic(storage, "t")
    store = SessionStore(storage)
    writer = SessionWriter(store, autostart=False)
    futures = [
        writer.write(record("a", topics=("t",)), None, NewCursors(("t",), None)),
        writer.write(record("b", topics=("gone",)), None, NewCursors(("gone",), None)),
        writer.write(record("c"), None),
    ]
    writer.start()
    a, b, c = answers(futures)
    writer.close()
    assert isinstance(a, Stored) and isinstance(c, Stored)
    assert isinstance(b, TopicNotFound)
    assert store.load("b") is None  # nothing of it: rolled back, then run alone
    assert store.load("a") is not None and store.load("c") is not None
    assert storage.get_cursors(cursor_name("s-a", "t")) == {head.key: 0}


def test_checkpoints_move_cursors_forward_and_skip_gone_ones(storage: Storage) -> None:
    heads = create_topic(storage, "t")
    create_topic(storage, "u")
    key = heads[0].key
    storage.append({key: numbered_rows(10)})
    store = SessionStore(storage)
    stored = store.write(record("c", topics=("t", "u")), None)
    store.ensure_cursors("s-c", ["t"], None, {key: 2})
    writer = SessionWriter(store)
    first = writer.commit(stored, {"t": {key: 7}, "u": {999: 1}}, {key: 8}, at_us=5).result(TIMEOUT)
    # A checkpoint never moves a cursor back.
    second = writer.commit(first, {"t": {key: 4}}, {key: 8}, at_us=6).result(TIMEOUT)
    writer.close()
    assert storage.get_cursors(cursor_name("s-c", "t")) == {key: 7}
    assert second.version == 3
    loaded = store.load("c")
    assert loaded is not None and loaded.record.seen_us == 6 and loaded.record.sent == {key: 8}


def test_many_threads_at_once(storage: Storage) -> None:
    """Connections writing concurrently: every write answered, stored once,
    in fewer transactions than writes."""
    store = SessionStore(storage)
    writer = SessionWriter(store)
    results: dict[str, Stored | BaseException] = {}
    go = threading.Barrier(8)

    def connection(n: int) -> None:
        go.wait()
        for i in range(25):
            client = f"t{n}-{i}"
            created = writer.write(record(client), None)
            error = created.exception(TIMEOUT)
            if error is not None:
                results[client] = error
                continue
            saved = writer.commit(created.result(), {}, {}, at_us=7)
            error = saved.exception(TIMEOUT)
            results[client] = saved.result() if error is None else error

    threads = [threading.Thread(target=connection, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
    writer.close()
    assert len(results) == 200
    assert all(isinstance(r, Stored) and r.version == 2 for r in results.values()), results
    assert writer.writes == 400
    assert writer.transactions < 400
    assert {s.record.client_id for s in store.all()} == set(results)


def test_closing_answers_what_was_queued(storage: Storage) -> None:
    writer = SessionWriter(SessionStore(storage), autostart=False)
    queued = writer.write(record("q"), None)
    writer.close()
    assert isinstance(queued.result(0), Stored)
    late = writer.write(record("late"), None)
    error = late.exception(0)
    assert isinstance(error, StorageError) and "closed" in str(error)


def test_a_store_that_refuses_writes_says_so(tmp_path: Path) -> None:
    """A full store: the writes it refuses fail with `StorageFull` (what the
    broker answers with CONNACK 0x88), and the writer goes on answering."""
    storage = open_storage(f"sqlite:///{tmp_path}/full.db?max_size=256KiB")
    try:
        writer = SessionWriter(SessionStore(storage))
        will = "w" * 60_000
        errors = [
            writer.write(record(f"c{i}", will=will), None).exception(TIMEOUT) for i in range(8)
        ]
        writer.close()
    finally:
        storage.close()
    assert errors[0] is None
    assert isinstance(errors[-1], StorageFull), errors


def test_an_idle_writer_commits_a_write_on_the_thread_that_asked(storage: Storage) -> None:
    """`commit_here` (the broker's event loop): on SQLite a write with nothing
    queued is committed before `write` returns, on the calling thread; on
    PostgreSQL every write goes through the writer's thread."""
    store = SessionStore(storage)
    writer = SessionWriter(store)
    writer.commit_here()
    future = writer.write(record("here"), None)
    embedded = storage.appends_inline
    if embedded:
        assert future.done() and writer.written_here == 1
    stored = future.result(TIMEOUT)
    assert stored.version == 1 and store.load("here") == stored
    # A refused compare-and-set is refused the same way.
    late = writer.write(record("here", seen_us=5), None).exception(TIMEOUT)
    assert isinstance(late, PreconditionFailed) and "exists already" in str(late)
    writer.close()
    assert writer.written_here == (2 if embedded else 0)
    assert writer.writes == 2


def test_a_write_queued_before_is_not_overtaken(sqlite_url: str) -> None:
    """Only with nothing queued: a write submitted behind a queued one queues
    too, and the writer's thread commits them in order."""
    storage = open_storage(sqlite_url)
    try:
        writer = SessionWriter(SessionStore(storage), autostart=False)
        writer.commit_here()
        first = writer.write(record("c"), None)
        assert first.done() and first.result().version == 1  # nothing queued before it
        other: list[Future[Stored]] = []
        behind = threading.Thread(target=lambda: other.append(writer.write(record("d"), None)))
        behind.start()
        behind.join()
        after = writer.write(record("c", seen_us=2), 1)
        assert not other[0].done() and not after.done() and writer.written_here == 1
        writer.start()
        assert [s.version for s in answers([*other, after])] == [1, 2]  # type: ignore[union-attr]
        writer.close()
        assert writer.transactions == 2  # the one here, then both queued ones together
    finally:
        storage.close()


def test_a_write_waits_for_the_thread_while_another_connection_writes(sqlite_url: str) -> None:
    """The database's write lock held by another connection: the write is not
    committed on the calling thread (it would block it), the writer's thread
    commits it once the lock is free."""
    storage = open_storage(sqlite_url)
    try:
        store = SessionStore(storage)
        writer = SessionWriter(store)
        writer.commit_here()
        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        future = writer.write(record("waits"), None)
        assert not future.done() and writer.written_here == 0
        other.execute("COMMIT")
        other.close()
        assert future.result(TIMEOUT).version == 1
        writer.close()
        assert writer.written_here == 0 and writer.transactions == 1
    finally:
        storage.close()


def test_the_loops_writes_of_one_turn_commit_together(sqlite_url: str) -> None:
    """Clients coming back together: the loop's first write of a turn commits
    at once, the others of that turn wait for its end and share one
    transaction (a refused one refuses only itself), and each is awaited."""
    storage = open_storage(sqlite_url)
    try:
        store = SessionStore(storage)
        store.write(record("taken"), None)
        writer = SessionWriter(store)

        async def turn() -> list[Stored | BaseException]:
            writer.commit_here()
            futures = [writer.write(record(f"c{i}"), None) for i in range(5)]
            futures.append(writer.write(record("taken"), None))  # exists already
            futures.append(writer.write(record("c1", seen_us=2), 1))  # behind c1's create
            assert [f.done() for f in futures] == [True] + [False] * 6
            return list(
                await asyncio.gather(*(outcome_of(f) for f in futures), return_exceptions=True)
            )

        *made, taken, moved = asyncio.run(turn())
        writer.close()
        assert [s.version for s in made] == [1] * 5  # type: ignore[union-attr]
        assert isinstance(taken, PreconditionFailed) and "exists already" in str(taken)
        assert isinstance(moved, Stored) and moved.version == 2
        assert writer.written_here == 7 and writer.writes == 7
        assert writer.transactions == 2  # the first alone, then the other six
        loaded = store.load("c1")
        assert loaded is not None and loaded.record.seen_us == 2
    finally:
        storage.close()


def test_a_turns_writes_go_to_the_thread_while_another_connection_writes(
    sqlite_url: str,
) -> None:
    """The write lock held elsewhere when the turn ends: its writes are not
    committed on the loop (it would block) but by the writer's thread, in
    order, once the lock is free."""
    storage = open_storage(sqlite_url)
    try:
        writer = SessionWriter(SessionStore(storage))
        other = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)

        async def turn() -> list[Stored]:
            writer.commit_here()
            futures = [writer.write(record("c"), None)]
            futures += [writer.write(record("c", seen_us=i), i - 1) for i in range(2, 5)]
            other.execute("BEGIN IMMEDIATE")  # before the turn ends
            await asyncio.sleep(0)  # the turn ends: its writes are queued
            assert writer.written_here == 1 and not any(f.done() for f in futures[1:])
            other.execute("COMMIT")
            return list(await asyncio.gather(*(outcome_of(f) for f in futures)))

        written = asyncio.run(turn())
        other.close()
        writer.close()
        assert [s.version for s in written] == [1, 2, 3, 4]
        assert writer.written_here == 1 and writer.transactions == 2
    finally:
        storage.close()


def test_a_turns_writes_are_answered_when_their_transaction_fails_unexpectedly(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the transaction of a turn's writes (not an error of the
    database): each of them gets it, as the writer's thread answers a batch
    that fails so; none waits for ever, and the writer goes on."""
    storage = open_storage(sqlite_url)
    try:
        writer = SessionWriter(SessionStore(storage))
        transaction = writer._transaction

        def bug(*args: object, **kwargs: object) -> None:
            raise RuntimeError("a bug in the transaction")

        async def turn() -> tuple[list[Stored | BaseException], Stored]:
            writer.commit_here()
            first = writer.write(record("first"), None)  # at once, before the bug
            monkeypatch.setattr(writer, "_transaction", bug)
            late = [writer.write(record(f"late{i}"), None) for i in range(3)]
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(outcome_of(f) for f in [first, *late]), return_exceptions=True),
                DEFAULT_TIMEOUT,
            )
            monkeypatch.setattr(writer, "_transaction", transaction)
            after = await outcome_of(writer.write(record("after"), None))
            return list(outcomes), after

        (first, *late), after = asyncio.run(turn())
        writer.close()
        assert isinstance(first, Stored)
        assert [type(o) for o in late] == [RuntimeError] * 3
        assert all("a bug in the transaction" in str(o) for o in late)
        assert after.version == 1
        store = SessionStore(storage)
        assert [store.load(f"late{i}") for i in range(3)] == [None] * 3
    finally:
        storage.close()


def test_a_turns_writes_left_when_the_writer_closes_are_answered(sqlite_url: str) -> None:
    """The writer closed before the loop's turn ended: on the loop's thread,
    the turn's later writes are made with what was queued; from another
    thread, they are answered with an error at the end of the turn. None
    waits for ever."""
    storage = open_storage(sqlite_url)
    try:
        for elsewhere in (False, True):
            writer = SessionWriter(SessionStore(storage))

            async def turn(
                writer: SessionWriter = writer, elsewhere: bool = elsewhere
            ) -> list[Stored | BaseException]:
                writer.commit_here()
                futures = [writer.write(record(f"c{i}-{elsewhere}"), None) for i in range(3)]
                if elsewhere:
                    closing = threading.Thread(target=writer.close)
                    closing.start()
                    closing.join()
                else:
                    writer.close()
                return list(
                    await asyncio.gather(*(outcome_of(f) for f in futures), return_exceptions=True)
                )

            first, *late = asyncio.run(turn())
            assert isinstance(first, Stored)
            if elsewhere:
                assert all(isinstance(e, StorageError) and "closed" in str(e) for e in late)
            else:
                assert [s.version for s in late] == [1, 1]  # type: ignore[union-attr]
    finally:
        storage.close()


def test_a_waiter_that_gives_up_fails_no_other_write(storage: Storage) -> None:
    """A connection whose task is cancelled while its write is queued (its
    client went away, the broker stops): the write is still made, and every
    other write of the batch is answered with what it wrote."""
    store = SessionStore(storage)
    writer = SessionWriter(store, autostart=False)
    futures = [writer.write(record(f"c{i}"), None) for i in range(3)]

    async def give_up() -> None:
        waiting = asyncio.ensure_future(outcome_of(futures[1]))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(give_up())
    # Not cancelled: what waits for the write itself (a SUBSCRIBE's hold on
    # its start positions) is let go when it is made, not before.
    assert not futures[1].done()
    writer.start()
    written = answers([futures[0], futures[2]])
    writer.close()
    assert [w.version for w in written] == [1, 1]  # type: ignore[union-attr]
    assert futures[1].result(TIMEOUT).version == 1  # made all the same


def test_a_write_committed_here_is_had_without_a_turn_of_the_loop() -> None:
    """`outcome_of` a write that committed on the loop's thread (its future done
    when `write` returns) gives it without suspending the coroutine: no wake-up
    of the loop from another thread, no turn more. A refused one raises at once."""
    stored = Stored(record("here"), 1)
    done: Future[Stored] = Future()
    done.set_result(stored)
    coroutine = outcome_of(done)
    with pytest.raises(StopIteration) as finished:
        coroutine.send(None)
    assert finished.value.value is stored

    refused: Future[Stored] = Future()
    refused.set_exception(PreconditionFailed("key sessions/here is not at version 1"))
    coroutine = outcome_of(refused)
    with pytest.raises(PreconditionFailed, match="version 1"):
        coroutine.send(None)


def test_a_write_the_thread_commits_is_awaited() -> None:
    """A write queued for the writer's thread: `outcome_of` waits for its answer."""
    stored = Stored(record("queued"), 1)
    pending: Future[Stored] = Future()

    async def wait() -> Stored:
        threading.Timer(0.05, pending.set_result, (stored,)).start()
        return await outcome_of(pending)

    assert asyncio.run(wait()) is stored


# --------------------------------------------------------------------- kept for the resume


def _saved_at_disconnect(storage: Storage) -> tuple[SessionStore, Stored, dict[int, int]]:
    """Session `c` on topic `t` (2 streams), saved at its disconnect by a
    writer: the store, what was saved, and the cursors as stored."""
    heads = create_topic(storage, "t", partitions=2)
    storage.append({heads[0].key: numbered_rows(5)})
    store = SessionStore(storage)
    stored = store.write(record("c", topics=("t",)), None)
    store.ensure_cursors("s-c", ["t"], None, {heads[0].key: 1, heads[1].key: 0})
    writer = SessionWriter(store)
    left = record("c", topics=("t",), connected=False, disconnected_us=9)
    saved = writer.commit(Stored(left, stored.version), {"t": {heads[0].key: 4}}, {}).result(
        TIMEOUT
    )
    writer.close()
    return store, saved, storage.get_cursors(cursor_name("s-c", "t"))


def test_a_save_at_disconnect_is_kept_for_the_resume_as_stored(storage: Storage) -> None:
    """The record, its bytes and its cursors, as the save's transaction left
    them (cursors it did not move included); taken once."""
    store, saved, cursors = _saved_at_disconnect(storage)
    kept = store.take_resumable("c")
    assert kept is not None
    entry = storage.kv_get("sessions", "c")
    assert entry is not None and kept.raw == entry.value
    assert kept.stored.record == saved.record and kept.stored.version == entry.version
    assert kept.cursors() == {"t": cursors} and len(cursors) == 2
    assert store.take_resumable("c") is None


def test_nothing_is_kept_but_a_save_at_disconnect_with_its_cursors(storage: Storage) -> None:
    heads = create_topic(storage, "t")
    store = SessionStore(storage)
    writer = SessionWriter(store)
    online = writer.write(record("on", topics=("t",)), None).result(TIMEOUT)
    store.ensure_cursors("s-on", ["t"], None)
    writer.commit(online, {"t": {heads[0].key: 0}}, {}).result(TIMEOUT)  # still connected
    gone = writer.write(record("gone", topics=("t",)), None).result(TIMEOUT)
    left = record("gone", topics=("t",), connected=False, disconnected_us=9)
    writer.commit(Stored(left, gone.version), {}, {}).result(TIMEOUT)  # no cursor on t
    writer.close()
    assert store.take_resumable("on") is None and store.take_resumable("gone") is None


@pytest.mark.parametrize("change", ["write", "discard", "the writer's discard"])
def test_any_other_write_of_the_record_forgets_what_was_kept(storage: Storage, change: str) -> None:
    store, saved, _ = _saved_at_disconnect(storage)
    if change == "write":
        store.write(replace(saved.record, seen_us=77), saved.version)
    elif change == "discard":
        store.discard(saved)
    else:
        writer = SessionWriter(store)
        assert writer.discard(saved).result(TIMEOUT) is saved
        writer.close()
    assert store.take_resumable("c") is None


def test_a_resume_with_the_kept_bytes_writes_only_over_those_bytes(storage: Storage) -> None:
    """The compare-and-set of a resume that did not read is on the bytes it
    kept: a record deleted and made again since, at the very same version,
    is not written over (on the version alone it would be)."""
    store, saved, _ = _saved_at_disconnect(storage)
    kept = store.take_resumable("c")
    assert kept is not None and saved.version is not None
    writer = SessionWriter(store)
    resumed = replace(saved.record, connected=True, epoch=1)
    # Deleted, and another session of the client made and saved elsewhere
    # until its record is at the version kept here.
    storage.kv_delete_if_version("sessions", "c", saved.version)
    other = store.write(record("c", "s-other"), None)
    while other.version is not None and other.version < saved.version:
        other = store.write(other.record, other.version)
    assert other.version == saved.version
    refused = writer.write(resumed, saved.version, expected=kept.raw)
    assert isinstance(refused.exception(TIMEOUT), PreconditionFailed)
    loaded = store.load("c")
    assert loaded is not None and loaded.record.session_id == "s-other"
    # Unchanged bytes: written.
    kept_again = _bytes_of(storage)
    written = writer.write(
        replace(other.record, seen_us=5), other.version, expected=kept_again
    ).result(TIMEOUT)
    writer.close()
    assert written.version == saved.version + 1


def _bytes_of(storage: Storage) -> bytes:
    entry = storage.kv_get("sessions", "c")
    assert entry is not None
    return entry.value


def test_a_save_written_over_in_the_same_transaction_is_not_kept(storage: Storage) -> None:
    heads = create_topic(storage, "t")
    store = SessionStore(storage)
    stored = store.write(record("c", topics=("t",)), None)
    store.ensure_cursors("s-c", ["t"], None)
    writer = SessionWriter(store, autostart=False)
    left = record("c", topics=("t",), connected=False, disconnected_us=9)
    save = writer.commit(Stored(left, stored.version), {"t": {heads[0].key: 0}}, {})
    assert stored.version is not None
    after = writer.write(record("c", topics=("t",), seen_us=8), stored.version + 1)
    writer.start()
    answers([save, after])
    writer.close()
    assert writer.transactions == 1
    assert store.take_resumable("c") is None


def test_what_is_kept_is_bounded_oldest_first(storage: Storage) -> None:
    heads = create_topic(storage, "t")
    store = SessionStore(storage)
    store.resumable_max = 2
    writer = SessionWriter(store)
    for name in ("a", "b", "c"):
        stored = writer.write(record(name, topics=("t",)), None).result(TIMEOUT)
        store.ensure_cursors(f"s-{name}", ["t"], None)
        left = record(name, topics=("t",), connected=False, disconnected_us=9)
        writer.commit(Stored(left, stored.version), {"t": {heads[0].key: 0}}, {}).result(TIMEOUT)
    writer.close()
    assert store.take_resumable("a") is None
    assert store.take_resumable("b") is not None and store.take_resumable("c") is not None
