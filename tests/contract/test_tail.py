"""Tails: backfill then live, no skip, no duplicate, across runtimes and reconnects."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

import yoke
from yoke import errors


async def _take(tail, n: int, timeout: float = 20) -> list[yoke.Event]:
    got = []

    async def run():
        async for e in tail:
            got.append(e)
            if len(got) == n:
                return

    await asyncio.wait_for(run(), timeout)
    return got


async def test_tail_backfills_then_follows(y, tenant):
    s = y.stream("/t", tenant=tenant)
    await s.append_many([{"type": "old", "payload": i} for i in range(3)])
    tail = s.tail(after=1)
    first = await _take(tail, 2)
    assert [e.offset for e in first] == [2, 3]
    later = asyncio.create_task(_take(tail, 2))
    await s.append({"type": "new", "payload": 3})
    await s.append({"type": "new", "payload": 4})
    assert [e.offset for e in await later] == [4, 5]
    await tail.aclose()


async def test_tail_waits_for_a_stream_that_does_not_exist_yet(y, tenant):
    s = y.stream("/later", tenant=tenant)
    got = asyncio.create_task(_take(s.tail(), 1))
    await s.append({"type": "born"})
    assert [e.type for e in await got] == ["born"]


async def test_tail_rejects_future_cursor(y, tenant):
    s = y.stream("/f", tenant=tenant)
    await s.append({"type": "x"})
    with pytest.raises(errors.InvalidCursor):
        await _take(s.tail(after=5), 1)


async def test_tail_sees_appends_from_another_runtime(db_url, tenant):
    # On PostgreSQL the wake-up crosses runtimes through LISTEN/NOTIFY; on
    # SQLite through the periodic sweep. Either way nothing is lost.
    async with yoke.open(db_url, tail_sweep_s=0.2) as a, yoke.open(db_url) as b:
        tail = a.stream("/x", tenant=tenant).tail()
        got = asyncio.create_task(_take(tail, 100))
        for i in range(100):
            await b.stream("/x", tenant=tenant).append({"type": "x", "payload": i})
        assert [e.payload for e in await got] == list(range(100))


async def test_reconnecting_tail_resumes_exactly_after_its_cursor(y, tenant):
    s = y.stream("/resume", tenant=tenant)
    producer_done = asyncio.Event()

    async def produce():
        for i in range(300):
            await s.append({"type": "x", "payload": i})
            if i % 50 == 0:
                await asyncio.sleep(0)
        producer_done.set()

    task = asyncio.create_task(produce())
    seen: list[int] = []
    cursor = 0
    while len(seen) < 300:
        # Reconnect every 37 events, from the last offset seen.
        tail = s.tail(after=cursor)
        chunk = await _take(tail, min(37, 300 - len(seen)))
        await tail.aclose()
        seen += [e.payload for e in chunk]
        cursor = chunk[-1].offset
    await task
    assert seen == list(range(300))


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_postgres_tail_survives_losing_its_listen_connection(db_url, tenant):
    # With the sweep effectively off, only LISTEN/NOTIFY can wake the tail:
    # this proves the listener reconnects and that the resync rereads what
    # was appended while it was deaf.
    async with yoke.open(db_url, tail_sweep_s=3600) as a, yoke.open(db_url) as b:
        listener = a.store.listener
        tail = a.stream("/deaf", tenant=tenant).tail()
        got = asyncio.create_task(_take(tail, 30))
        writer = b.stream("/deaf", tenant=tenant)
        for i in range(10):
            await writer.append({"type": "x", "payload": i})
        generation = listener.generation
        admin = await asyncpg.connect(db_url)
        try:
            assert await admin.fetchval("SELECT pg_terminate_backend($1)", listener.backend_pid)
        finally:
            await admin.close()
        for i in range(10, 20):  # appended while the listener may be deaf
            await writer.append({"type": "x", "payload": i})
        await asyncio.wait_for(listener.wait_generation(generation + 1), 20)
        for i in range(20, 30):
            await writer.append({"type": "x", "payload": i})
        assert [e.payload for e in await got] == list(range(30))


async def test_closing_the_runtime_ends_tails_cleanly(db_url, tenant):
    y = yoke.Runtime(yoke.Settings.from_env(database_url=db_url))
    await y.start()
    s = y.stream("/closing", tenant=tenant)
    await s.append({"type": "x"})
    got = []

    async def follow():
        async for e in s.tail():
            got.append(e.offset)

    task = asyncio.create_task(follow())
    async with asyncio.timeout(20):
        while not got:
            await asyncio.sleep(0.01)
    await y.close()
    with pytest.raises(errors.RuntimeClosed):
        await asyncio.wait_for(task, 10)
    for call in (s.read(), s.info(), s.set_legal_hold(True), s.get(1)):
        with pytest.raises(errors.RuntimeClosed):
            await call


# --- closed streams: a tail delivers everything up to the head, then ends --------


async def _all(tail, timeout: float = 20) -> list[yoke.Event]:
    """Every event of a tail that must end by itself."""
    async def run():
        return [e async for e in tail]

    return await asyncio.wait_for(run(), timeout)


async def test_tail_of_a_closed_stream_delivers_everything_then_ends(y, tenant):
    s = y.stream("/done", tenant=tenant)
    await s.append_many([{"type": "x", "payload": i} for i in range(2500)])  # more than a page
    await s.close()
    assert [e.payload for e in await _all(s.tail())] == list(range(2500))
    assert [e.offset for e in await _all(s.tail(after=2400))] == list(range(2401, 2501))
    assert await _all(s.tail(after=2500)) == []  # already at the head
    only_odd = s.tail(filter={"types": ["x"], "where": "payload % 2 = 1"})
    assert len(await _all(only_odd)) == 1250  # a filtered tail ends too


async def test_a_tail_reads_on_past_pages_cut_by_their_byte_cap(y, tenant):
    # 40 events of 60 KB are 2.4 MB: pages end at PAGE_BYTES, well before
    # PAGE events. Each short page is not the head: the tail reads on (on a
    # closed stream, where it would otherwise end) and delivers all of them.
    from yoke.streams.tail import PAGE_BYTES

    s = y.stream("/big", tenant=tenant)
    payloads = [f"{i}:" + "x" * 60_000 for i in range(40)]
    await s.append_many([{"type": "big", "payload": p} for p in payloads])
    await s.append({"type": "eph", "payload": "x" * 60_000, "ephemeral": True})
    await s.close()
    assert 40 * 60_000 > 2 * PAGE_BYTES
    assert [e.payload for e in await _all(s.tail())] == payloads + ["x" * 60_000]
    assert [e.offset for e in await _all(s.tail(after=30))] == list(range(31, 42))


async def test_closing_a_stream_ends_its_live_tails(y, tenant):
    s = y.stream("/live", tenant=tenant)
    await s.append({"type": "x"})
    got: list[int] = []
    first = asyncio.Event()

    async def follow(tail):
        async for e in tail:
            got.append(e.offset)
            first.set()
        return "ended"

    tails = [asyncio.create_task(follow(s.tail())), asyncio.create_task(follow(s.tail(include_ephemeral=False)))]
    await asyncio.wait_for(first.wait(), 20)
    await s.append({"type": "x"})
    await s.append({"type": "e", "ephemeral": True})
    await s.close()
    assert await asyncio.wait_for(asyncio.gather(*tails), 20) == ["ended", "ended"]
    assert sorted(got) == [1, 1, 2, 2, 3]  # the ephemeral event only to the tail that asked for it


async def test_a_close_in_another_runtime_ends_the_tail(db_url, tenant):
    # Another process's close reaches a tail at its next sweep at the latest.
    async with yoke.open(db_url, tail_sweep_s=0.2) as a, yoke.open(db_url) as b:
        await b.stream("/elsewhere", tenant=tenant).append({"type": "x"})
        tail = asyncio.create_task(_all(a.stream("/elsewhere", tenant=tenant).tail()))
        await b.stream("/elsewhere", tenant=tenant).append({"type": "x"})
        await b.stream("/elsewhere", tenant=tenant).close()
        assert [e.offset for e in await tail] == [1, 2]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_postgres_forgets_the_pids_of_closed_connections(db_url, tenant):
    """The listener skips NOTIFYs sent by this process's own pool
    connections (it woke its readers itself). The pids it skips are those of
    open connections only: a connection that ended (cut, replaced) is
    forgotten, since PostgreSQL reuses pids and another process's wake-up
    from a reused pid must not be ignored. So the set stays the size of the
    pool however many connections were replaced."""
    async with yoke.open(db_url, executor=False, tail_sweep_s=3600) as y:
        store = y.store
        stream = y.stream("/pids", tenant=tenant)

        def open_pids() -> set[int]:
            return {h._con.get_server_pid() for h in store.pool._holders  # noqa: SLF001
                    if h._con is not None and not h._con.is_closed()}  # noqa: SLF001

        await asyncio.gather(*(stream.read() for _ in range(6)))
        first = set(store.db.own_pids)  # noqa: SLF001
        assert first and first == open_pids()
        ended: set[int] = set()
        admin = await asyncpg.connect(db_url)
        try:
            for _ in range(3):
                pids = open_pids()
                await admin.fetchval(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM unnest($1::int[]) pid",
                    list(pids))
                ended |= pids
                async with asyncio.timeout(10):
                    while store.db.own_pids & ended:  # noqa: SLF001
                        await asyncio.sleep(0.01)
                await asyncio.gather(*(stream.read() for _ in range(6)))  # the pool opens new ones
        finally:
            await admin.close()
        assert store.db.own_pids == open_pids()  # noqa: SLF001
        assert len(store.db.own_pids) <= store.db.pool_max  # noqa: SLF001
        # A NOTIFY from a pid this process used to have is another process's now.
        listener = store.listener
        waiter = y.hub.subscribe(tenant, "/pids")
        try:
            listener._notified(None, next(iter(ended)), "yoke_stream", f"{tenant}|/pids")  # noqa: SLF001
            await asyncio.wait_for(waiter.wait(), 1)
            # ... while one from an open pool connection is still skipped.
            listener._notified(None, next(iter(open_pids())), "yoke_stream", f"{tenant}|/pids")  # noqa: SLF001
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(waiter.wait(), 0.2)
        finally:
            waiter.close()
