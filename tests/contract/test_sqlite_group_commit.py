"""SQLite's writer thread: the commits that wait together share one
transaction, and their event rows go in together at its end. What a
commit sees and what reads return must not show that the rows waited."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import yoke
from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.contract import Admitted

from tests.faults.common import wait_until

TENANT = "group"


async def queued_together(store: Any, starts: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Run ``starts`` as commits queued while the writer is busy, so that
    they go into one group, and return their results."""
    gate = threading.Event()
    holding = asyncio.ensure_future(store.db.write(gate.wait))
    try:
        tasks = [asyncio.ensure_future(start()) for start in starts]
        await wait_until(lambda: len(store.db._commits) == len(starts), 10, "the commits queued")
    finally:
        gate.set()
    await holding
    return await asyncio.gather(*tasks)


async def test_a_key_committed_earlier_in_the_group_is_a_duplicate(tmp_path) -> None:
    """Two commits on one stream with the same idempotency key, in one
    group: the second finds the first's row (held back until the group's
    end otherwise) and gets its offset; one event is stored."""
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store

        def keyed(extra: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
            event = prepare({"type": "e", "idempotency_key": "k", **extra})
            return lambda: store.commit(TENANT, "/keys", [event], [0], now_ms(), "s1")

        plain = prepare({"type": "before"})
        first, second, third = await queued_together(store, [
            lambda: store.commit(TENANT, "/keys", [plain], [0], now_ms(), "s1"),
            keyed({}),
            keyed({}),
        ])
        assert first.outcomes[0].offset == 1
        assert (second.outcomes[0].status, second.outcomes[0].offset) == ("ok", 2)
        assert (third.outcomes[0].status, third.outcomes[0].offset) == ("duplicate", 2)
        assert third.outcomes[0].id == second.outcomes[0].id
        assert [e.type for e in await y.stream("/keys", tenant=TENANT).read()] == ["before", "e"]

        conflicting = await queued_together(store, [keyed({"payload": {"other": True}})])
        assert conflicting[0].outcomes[0].status == "conflict"


async def test_rows_of_many_commits_read_back_as_appended(tmp_path) -> None:
    """Commits on several streams, some events with every optional field
    and some with none (the insert leaves all-NULL columns out of its
    parameters), in one group: each stream reads back its events exactly,
    offsets from 1."""
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        full = {
            "type": "full", "payload": {"n": 1}, "source": {"app": "a"}, "correlation": "c",
            "group_id": "g", "metadata": {"m": 1}, "priority": 3,
        }
        shapes: dict[str, list[dict[str, Any]]] = {
            "/plain": [{"type": "plain", "payload": i} for i in range(300)],
            "/full": [{**full, "idempotency_key": f"k{i}"} for i in range(5)],
            "/mixed": [full if i % 2 else {"type": "plain", "payload": i} for i in range(7)],
        }

        def commit(path: str, raws: list[dict[str, Any]]) -> Callable[[], Awaitable[Any]]:
            events = [prepare(r) for r in raws]
            return lambda: store.commit(TENANT, path, events, [0] * len(events), now_ms(), f"s-{path}")

        # Another tenant's commit in the same group: a chunk of both binds
        # the tenant per row, not once (group_writes' shared columns).
        elsewhere = [prepare({"type": "plain", "payload": i}) for i in range(3)]
        results = await queued_together(store, [
            lambda: store.commit("other", "/plain", elsewhere, [0] * 3, now_ms(), "s-other")
        ] + [commit(p, raws) for p, raws in shapes.items()])
        results = results[1:]
        assert [e.payload for e in await y.stream("/plain", tenant="other").read()] == [0, 1, 2]
        for (path, raws), result in zip(shapes.items(), results):
            assert [o.offset for o in result.outcomes] == list(range(1, len(raws) + 1))
            stored = await y.stream(path, tenant=TENANT).read(limit=1000)
            assert [e.offset for e in stored] == list(range(1, len(raws) + 1))
            for event, raw in zip(stored, raws):
                assert event.type == raw["type"]
                assert event.payload == raw.get("payload")
                assert event.source == raw.get("source")
                assert event.correlation == raw.get("correlation")
                assert event.group_id == raw.get("group_id")
                assert event.metadata == raw.get("metadata", {})
                assert event.priority == raw.get("priority", 0)
                assert event.idempotency_key == raw.get("idempotency_key")


async def test_commits_see_stream_changes_made_between_them(tmp_path) -> None:
    """The writer keeps copies of the stream rows its commits read. A
    change made by anything else (closing the stream, its limits, a
    delete and recreate, another connection's commit) is what the next
    commit sees."""
    import sqlite3

    from yoke import errors
    from yoke.store.contract import Limits

    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        closing = y.stream("/closing", tenant=TENANT)
        await closing.append({"type": "e"})
        await closing.append({"type": "e"})  # its row is read (and copied) now
        await closing.close()
        with pytest.raises(errors.StreamClosed):
            await closing.append({"type": "e"})

        limited = y.stream("/limited", tenant=TENANT)
        await limited.append({"type": "e"})
        await limited.set_limits(Limits(max_total_events=2))
        await limited.append({"type": "e"})
        with pytest.raises(errors.YokeError) as refused:
            await limited.append({"type": "e"})
        assert refused.value.code == "quota_exhausted"

        again = y.stream("/again", tenant=TENANT)
        await again.append_many([{"type": "e"}] * 3)
        await again.append({"type": "e"})
        await again.delete()
        assert (await again.append({"type": "new"})).offset == 1

        other = y.stream("/other", tenant=TENANT)
        assert (await other.append({"type": "e"})).offset == 1
        assert (await other.append({"type": "e"})).offset == 2
        outside = sqlite3.connect(tmp_path / "yoke.db", isolation_level=None)
        try:
            outside.execute("UPDATE streams SET closed=1 WHERE tenant_id=? AND path=?", (TENANT, "/other"))
        finally:
            outside.close()
        with pytest.raises(errors.StreamClosed):
            await other.append({"type": "e"})
        assert [e.type for e in await other.read()] == ["e", "e"]


async def test_a_guarded_commit_sees_what_the_group_held_back(tmp_path) -> None:
    """An ephemeral event takes an offset but writes no row, so only the
    stream's held-back head says it was taken: a guarded (protocol) commit
    later in the same group reads the stream row after that head is
    written, and takes the next offset, not the same one."""
    from yoke.store.durable_streams import Guard

    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        stream = y.stream("/p", tenant=TENANT)
        await stream.append({"type": "first"})
        await stream.append({"type": "second"})  # the writer copies the row now
        fleeting = prepare({"type": "fleeting", "ephemeral": True})
        guarded = prepare({"type": "guarded"})
        first, second = await queued_together(store, [
            lambda: store.commit(TENANT, "/p", [fleeting], [0], now_ms(), "s"),
            lambda: store.commit(TENANT, "/p", [guarded], [0], now_ms(), "s", [Guard()]),
        ])
        assert first.outcomes[0].offset == 3
        assert second.outcomes[0].offset == 4
        assert [(e.offset, e.type) for e in await stream.read()] == [(1, "first"), (2, "second"), (4, "guarded")]
        assert (await stream.info()).head == 4


async def test_a_guarded_close_reaches_the_next_plain_commit(tmp_path) -> None:
    """A protocol close (a guarded commit) changes the stream row other than
    by appending: the writer's copy of it is dropped, so the next plain
    append through Yoke's own API finds the stream closed."""
    from yoke import errors
    from yoke.store.durable_streams import Guard

    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        stream = y.stream("/c", tenant=TENANT)
        await stream.append({"type": "e"})
        await stream.append({"type": "e"})  # the writer copies the row now
        closed = await store.commit(TENANT, "/c", [], [], now_ms(), "s", [Guard(close=True)])
        assert closed.guards is not None and closed.guards[0].status == "ok"
        with pytest.raises(errors.StreamClosed):
            await stream.append({"type": "late"})
        assert [e.type for e in await stream.read()] == ["e", "e"]


async def test_a_group_keeps_each_streams_counters(tmp_path) -> None:
    """Held-back advances of several commits on one stream and on others
    add up: heads, durable events and bytes, and unread counts for a stream
    with a consumer."""
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        read = y.stream("/counted", tenant=TENANT)
        await read.append({"type": "e", "payload": "x"})
        await read.ack("c", 1)  # a consumer: unread counts are kept from now on
        before = await read.info()
        batches = {"/counted": 3, "/other": 2}
        events = {path: [prepare({"type": "e", "payload": "y" * 10}) for _ in range(4)] for path in batches}
        starts = [
            (lambda p=path: store.commit(TENANT, p, events[p], [0] * 4, now_ms(), f"s-{p}"))
            for path, times in batches.items() for _ in range(times)
        ]
        await queued_together(store, starts)
        size = events["/counted"][0].size
        after = await read.info()
        assert after.head == before.head + 12
        assert after.usage.durable_events == before.usage.durable_events + 12
        assert after.usage.durable_bytes == before.usage.durable_bytes + 12 * size
        assert after.usage.unread_events == before.usage.unread_events + 12
        assert after.usage.unread_bytes == before.usage.unread_bytes + 12 * size
        other = await y.stream("/other", tenant=TENANT).info()
        assert (other.head, other.usage.durable_events, other.usage.durable_bytes) == (8, 8, 8 * size)


async def test_a_new_file_gets_8k_pages_and_an_old_file_keeps_its_own(tmp_path) -> None:
    """The page size applies to a new database file only: a file made with
    SQLite's default 4 KiB pages opens, takes appends and reads them back."""
    import sqlite3

    from yoke.store.sqlite.connection import PAGE_SIZE

    async with yoke.open(f"sqlite:///{tmp_path}/new.db", executor=False) as y:
        await y.stream("/p").append({"type": "e"})
    with sqlite3.connect(tmp_path / "new.db") as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE == 8192

    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("PRAGMA page_size=4096")  # as files made before PAGE_SIZE
        conn.execute("PRAGMA journal_mode=WAL")  # the file now exists with 4 KiB pages
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096
    async with yoke.open(f"sqlite:///{tmp_path}/old.db", executor=False) as y:
        await y.stream("/p").append_many([{"type": "e", "payload": {"n": n}} for n in range(500)])
        assert [e.payload["n"] for e in await y.stream("/p").read(limit=1000)] == list(range(500))
    with sqlite3.connect(tmp_path / "old.db") as conn:
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 4096


async def test_a_commit_that_takes_every_event_answers_them_all(tmp_path) -> None:
    """A commit whose events are all new gives their outcomes as a sequence
    made on demand: every index, slice and iteration says what a list would,
    ephemeral events included (they take offsets but store no row)."""
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db", executor=False) as y:
        store = y.store
        events = [prepare({"type": "e", "payload": {"n": n}, "ephemeral": n == 2}) for n in range(5)]
        await store.commit(TENANT, "/all", [prepare({"type": "first"})], [0], now_ms(), "s1")
        result = await store.commit(TENANT, "/all", events, [0] * 5, 1234, "s1")
        assert isinstance(result.outcomes, Admitted)  # made on demand, not a list
        expected = [("ok", 2 + i, e.id, 1234) for i, e in enumerate(events)]
        assert [tuple(o) for o in result.outcomes] == expected
        assert [tuple(result.outcomes[i]) for i in range(-5, 5)] == expected + expected
        assert [tuple(o) for o in result.outcomes[1:4]] == expected[1:4]
        assert [tuple(o) for o in result.outcomes[3:][1:]] == expected[4:]
        assert [tuple(o) for o in result.outcomes[::2]] == expected[::2]
        assert len(result.outcomes) == 5 and result.head == 6
        for beyond in (5, -6):
            with pytest.raises(IndexError):
                result.outcomes[beyond]
        stored = await y.stream("/all", tenant=TENANT).read()
        assert [e.offset for e in stored] == [1, 2, 3, 5, 6]  # offset 4 was ephemeral
