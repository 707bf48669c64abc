"""The SQLite store finds events by offset through event_blocks
(store/sqlite/event_blocks.py). Whatever the writes (batches, concurrent
commits to several streams in one group, ephemeral events that take
offsets and no row, retention, deletion and a new stream at the path,
forks), every stored event lies in exactly one block of its stream at the
rowid the block says, the blocks of a stream never overlap, and every read
returns what was written."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yoke
from tests.conftest import now_ms
from yoke.http.durable_streams.messages import events_of
from yoke.store.durable_streams import CreateSpec, Guard


def blocks_broken(db: sqlite3.Connection) -> dict[str, int]:
    """How the file breaks the blocks' invariant: events in no block or in
    more than one, blocks of a stream that overlap, blocks that end before
    they begin (all zero when it holds)."""
    return {
        "events not in exactly one block": db.execute(
            "SELECT count(*) FROM event_rows e WHERE (SELECT count(*) FROM event_blocks b"
            " WHERE b.tenant_id = e.tenant_id AND b.sid = e.sid AND e.seq BETWEEN b.first_seq AND b.last_seq"
            " AND b.first_rowid + e.seq - b.first_seq = e.row_id) <> 1"
        ).fetchone()[0],
        "overlapping blocks": db.execute(
            "SELECT count(*) FROM (SELECT first_seq, lag(last_seq) OVER"
            " (PARTITION BY tenant_id, sid ORDER BY last_seq) AS before FROM event_blocks) WHERE first_seq <= before"
        ).fetchone()[0],
        "backward blocks": db.execute("SELECT count(*) FROM event_blocks WHERE first_seq > last_seq").fetchone()[0],
    }


def broken_in(path: Path) -> dict[str, int]:
    db = sqlite3.connect(path)
    try:
        return blocks_broken(db)
    finally:
        db.close()


INTACT = {"events not in exactly one block": 0, "overlapping blocks": 0, "backward blocks": 0}
STREAMS = ("/a", "/b", "/c")

APPEND = st.tuples(st.just("append"), st.integers(0, 2), st.lists(st.booleans(), min_size=1, max_size=12))
BURST = st.tuples(st.just("burst"), st.lists(st.tuples(st.integers(0, 2), st.booleans()), min_size=2, max_size=10))
PRUNE = st.tuples(st.just("prune"), st.integers(0, 2), st.integers(1, 8))
DELETE = st.tuples(st.just("delete"), st.integers(0, 2))
OPS = st.lists(st.one_of(APPEND, APPEND, BURST, PRUNE, DELETE), min_size=1, max_size=14)


async def _run(path: Path, ops: list[tuple]) -> dict[str, dict[int, int]]:
    """Apply ``ops``; the model: each stream's stored events, offset -> payload."""
    model: dict[str, dict[int, int]] = {p: {} for p in STREAMS}
    heads = dict.fromkeys(STREAMS, 0)
    n = 0
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        for op in ops:
            if op[0] == "append":
                stream = STREAMS[op[1]]
                batch = []
                for ephemeral in op[2]:
                    n += 1
                    heads[stream] += 1
                    batch.append({"type": "e", "payload": n, "ephemeral": ephemeral})
                    if not ephemeral:
                        model[stream][heads[stream]] = n
                await y.stream(stream).append_many(batch)
            elif op[0] == "burst":  # concurrent commits: one group, rows of several streams interleaved
                appends = []
                for i, ephemeral in op[1]:
                    n += 1
                    appends.append(y.stream(STREAMS[i]).append({"type": "e", "payload": n, "ephemeral": ephemeral}))
                for result, (i, ephemeral) in zip(await asyncio.gather(*appends), op[1], strict=True):
                    stream = STREAMS[i]
                    heads[stream] = max(heads[stream], result.offset)
                    if not ephemeral:
                        model[stream][result.offset] = (await y.stream(stream).get(result.offset)).payload
            elif op[0] == "prune":
                stream, keep = STREAMS[op[1]], op[2]
                if heads[stream] == 0:
                    continue
                await y.stream(stream).set_retention(max_events=keep)
                await y.store.prune(now_ms())
                for seq in sorted(model[stream])[: max(0, len(model[stream]) - keep)]:
                    del model[stream][seq]
                await y.stream(stream).set_retention(max_events=None)
            else:
                stream = STREAMS[op[1]]
                if heads[stream] == 0:
                    continue
                await y.stream(stream).delete()
                model[stream], heads[stream] = {}, 0
        for stream in STREAMS:
            if heads[stream] == 0:
                continue
            s = y.stream(stream)
            kept = model[stream]
            pruned = (await s.info()).earliest - 1
            assert {e.offset: e.payload for e in await s.read(after=pruned, limit=1000)} == kept
            for after in range(pruned, heads[stream] + 1, 3):  # pages from every third offset on
                page = await s.read(after=after, limit=2)
                assert [e.offset for e in page] == [o for o in sorted(kept) if o > after][:2]
            for offset in sorted(kept):
                assert (await s.get(offset)).payload == kept[offset]
            assert (await s.info()).usage.durable_events == len(kept)
    return model


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_blocks_hold_every_event_whatever_the_writes(tmp_path_factory, ops) -> None:
    path = tmp_path_factory.mktemp("blocks") / "yoke.db"
    asyncio.run(_run(path, ops))
    assert broken_in(path) == INTACT


async def test_a_fork_copies_through_blocks_with_gaps(tmp_path) -> None:
    """A fork's copy of its source: the source's rows interleaved with
    another stream's, its prefix pruned; the copy reads back the same at
    every offset, and the fork's own appends follow it."""
    path = tmp_path / "yoke.db"
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        store = y.store
        source, _ = await store.protocol.create(
            "default", "/src", "src-1", now_ms(), CreateSpec(content_type="application/json")
        )
        for i in range(6):  # /src's rows between /other's
            body = f'[{{"n":{2 * i}}},{{"n":{2 * i + 1}}}]'.encode()
            await store.commit("default", "/src", events_of(body, "application/json"), [0, 0], now_ms(), "x",
                               [Guard(stream_id=source.stream_id)])
            await y.stream("/other").append({"type": "between", "payload": i})
        await y.stream("/src").set_retention(max_events=9)
        await store.prune(now_ms())
        forked, _ = await store.protocol.create(
            "default", "/fork", "fork-1", now_ms(), CreateSpec(content_type=None, fork_of="/src", fork_offset=10)
        )
        assert forked.head == 10
        page = await store.read_stored("default", "/fork", 0, 100, 1 << 20)
        assert [e.offset for e in page.events] == list(range(4, 11))
        source_page = await store.read_stored("default", "/src", 3, 7, 1 << 20)
        assert [e.payload_json for e in page.events] == [e.payload_json for e in source_page.events]
        for offset in range(4, 11):
            one = await store.read_one("default", "/fork", offset)
            assert [e.offset for e in one.events] == [offset]
        await store.commit("default", "/fork", events_of(b'[{"n":"own"}]', "application/json"), [0], now_ms(), "x",
                           [Guard(stream_id=forked.stream_id)])
        page = await store.read_stored("default", "/fork", 9, 100, 1 << 20)
        assert [e.offset for e in page.events] == [10, 11]
        info = await y.stream("/fork").info()
        assert (info.head, info.usage.durable_events) == (11, 8)
    assert broken_in(path) == INTACT


async def test_the_migration_builds_blocks_for_stored_events(tmp_path) -> None:
    """Migration 0014 builds the blocks of a file's events from the rows:
    interleaved streams, gaps of ephemeral events, a pruned prefix, a stream
    deleted and made again all read back the same after it."""
    from tests.contract.test_migrations import _undo_sqlite_migrations

    path = tmp_path / "yoke.db"
    ops = [
        ("append", 0, [False] * 5), ("burst", [(0, False), (1, False), (0, True), (2, False), (0, False)]),
        ("append", 1, [False, True, True, False]), ("prune", 0, 3), ("delete", 2),
        ("append", 2, [False, False]), ("burst", [(1, False), (2, False), (1, False)]),
    ]
    model = await _run(path, ops)
    _undo_sqlite_migrations(path, "0014_event_blocks.sql")
    db = sqlite3.connect(path)
    assert db.execute("SELECT count(*) FROM sqlite_master WHERE name = 'event_blocks'").fetchone()[0] == 0
    db.close()
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        for stream in STREAMS:
            pruned = (await y.stream(stream).info()).earliest - 1
            assert {e.offset: e.payload for e in await y.stream(stream).read(after=pruned, limit=1000)} == model[stream]
            for offset, payload in model[stream].items():
                assert (await y.stream(stream).get(offset)).payload == payload
    assert broken_in(path) == INTACT


async def test_reads_at_the_edge_of_the_offsets(tmp_path) -> None:
    """Offsets at the top of the 64-bit range reach the block statements as
    bounds, never as a sum that overflows."""
    top = 2**63 - 1
    async with yoke.open(f"sqlite:///{tmp_path / 'yoke.db'}", executor=False) as y:
        await y.stream("/edge").append_many([{"type": "e", "payload": i} for i in range(3)])
        for stored in (False, True):
            read = y.store.read_stored if stored else y.store.read
            assert (await read("default", "/edge", top, 10, 1 << 20)).events == []
            assert len((await read("default", "/edge", 0, 100, 1 << 20)).events) == 3
        assert (await y.store.read_one("default", "/edge", top)).events == []
        assert await y.store.read_payloads("default", "/edge", top, 10, 1 << 20, "e") is not None


async def test_vacuum_and_a_dump_keep_every_event_readable(tmp_path) -> None:
    """The blocks hold row ids: the events' row id is a declared INTEGER
    PRIMARY KEY, which VACUUM and a dump restored into a new file keep (a
    plain rowid they may renumber, here closing the gap a deleted stream
    left between the others' rows)."""
    path = tmp_path / "yoke.db"
    async with yoke.open(f"sqlite:///{path}", executor=False) as y:
        for i in range(4):
            for stream in STREAMS:
                await y.stream(stream).append_many([{"type": "e", "payload": [stream, i, k]} for k in range(3)])
        await y.stream("/b").delete()
        before = {p: [e.payload for e in await y.stream(p).read(limit=100)] for p in ("/a", "/c")}
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("VACUUM")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    restored_path = tmp_path / "restored.db"
    restored = sqlite3.connect(restored_path, isolation_level=None)
    restored.executescript("\n".join(db.iterdump()))
    restored.execute(f"PRAGMA user_version = {version}")
    db.close()
    restored.close()
    for copy in (path, restored_path):
        async with yoke.open(f"sqlite:///{copy}", executor=False) as y:
            assert {p: [e.payload for e in await y.stream(p).read(limit=100)] for p in ("/a", "/c")} == before
        assert broken_in(copy) == INTACT
