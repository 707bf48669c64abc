"""Ephemeral events: real offsets, never stored, never reused."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors


async def test_ephemeral_takes_an_offset_but_is_not_stored(y, tenant):
    s = y.stream("/e", tenant=tenant)
    await s.append({"type": "durable"})
    r = await s.append({"type": "chunk", "payload": "partial", "ephemeral": True})
    await s.append({"type": "durable"})
    assert r.offset == 2
    assert [e.offset for e in await s.read()] == [1, 3]
    merged = await s.read(include_ephemeral=True)
    assert [(e.offset, e.ephemeral) for e in merged] == [(1, False), (2, True), (3, False)]
    assert (await s.get(2)).payload == "partial"
    assert (await s.info()).head == 3


async def test_tail_delivers_ephemeral_events_live(y, tenant):
    s = y.stream("/live", tenant=tenant)
    got: list[tuple[int, bool]] = []

    async def follow():
        async for e in s.tail():
            got.append((e.offset, e.ephemeral))
            if len(got) == 60:
                return

    task = asyncio.create_task(follow())
    # Mixed groups: concurrent durable and ephemeral appends.
    await asyncio.gather(
        *(s.append({"type": "x", "ephemeral": i % 3 == 0}) for i in range(60))
    )
    await asyncio.wait_for(task, 20)
    assert [o for o, _ in got] == list(range(1, 61))
    assert sum(1 for _, eph in got if eph) == 20
    # A tail that opts out sees only the durable ones.
    durable = [e.offset async for e in _first(s.tail(include_ephemeral=False), 40)]
    assert durable == [o for o, eph in got if not eph]


async def _first(tail, n):
    count = 0
    async for e in tail:
        yield e
        count += 1
        if count == n:
            return


async def test_offsets_are_never_reused_after_reopen(db_url, tenant):
    async with yoke.open(db_url) as y:
        s = y.stream("/reopen", tenant=tenant)
        await s.append({"type": "a"})
        await s.append_many([{"type": "tmp", "ephemeral": True}] * 3)
    async with yoke.open(db_url) as y:
        s = y.stream("/reopen", tenant=tenant)
        # The restart forgot the buffer, but not the offsets.
        assert [e.offset for e in await s.read(include_ephemeral=True)] == [1]
        assert (await s.append({"type": "b"})).offset == 5
        with pytest.raises(errors.EventNotFound):
            await s.get(3)


async def test_buffer_evicts_oldest_first(db_url, tenant):
    async with yoke.open(db_url, ephemeral_buffer_bytes=10_000) as y:
        s = y.stream("/evict", tenant=tenant)
        for i in range(20):
            await s.append({"type": "chunk", "payload": "x" * 900, "ephemeral": True})
        kept = [e.offset for e in await s.read(include_ephemeral=True)]
        assert kept == list(range(20 - len(kept) + 1, 21)) and 5 <= len(kept) < 20
        assert y.buffers.get(tenant, "/evict").bytes <= 10_000


async def test_oversized_ephemeral_is_rejected_before_taking_an_offset(db_url, tenant):
    async with yoke.open(db_url, ephemeral_buffer_bytes=1000) as y:
        s = y.stream("/huge", tenant=tenant)
        await s.append({"type": "a"})
        with pytest.raises(errors.EphemeralTooLarge) as exc:
            await s.append({"type": "chunk", "payload": "x" * 2000, "ephemeral": True})
        assert exc.value.http_status == 413
        assert (await s.info()).head == 1
        assert (await s.append({"type": "b"})).offset == 2


async def test_mixed_appends_with_many_tails_skip_nothing(db_url, tenant):
    async with yoke.open(db_url, ephemeral_buffer_bytes=1 << 30) as y:
        s = y.stream("/mixed", tenant=tenant)
        total = 20 * 50

        async def follow(ready):
            got = []
            tail = s.tail()
            ready.set()
            async for e in tail:
                got.append(e.offset)
                if e.offset >= total:
                    return got

        readies = [asyncio.Event() for _ in range(5)]
        tails = [asyncio.create_task(follow(r)) for r in readies]

        async def produce(p):
            for i in range(50):
                await s.append({"type": "x", "payload": {"pad": "y" * 500}, "ephemeral": i % 2 == 1})

        await asyncio.gather(*(produce(p) for p in range(20)))
        for got in await asyncio.wait_for(asyncio.gather(*tails), 30):
            assert got == list(range(1, total + 1))


async def test_read_held_in_transit_does_not_skip_a_durable_event(db_url, tenant):
    # A read whose snapshot predates durable event 5 but whose result is
    # handled after ephemeral event 6 was buffered must not jump to 6.
    async with yoke.open(db_url) as y:
        s = y.stream("/transit", tenant=tenant)
        await s.append_many([{"type": "d"}] * 3)
        await s.append({"type": "e", "ephemeral": True})
        real_read = y.store.read
        gate = asyncio.Event()
        held = asyncio.Event()

        async def delayed_read(*args, **kwargs):
            page = await real_read(*args, **kwargs)
            if not held.is_set():
                held.set()
                await gate.wait()  # the result is "in transit"
            return page

        y.store.read = delayed_read
        got: list[int] = []

        async def follow():
            async for e in s.tail(after=4):
                got.append(e.offset)
                if len(got) == 2:
                    return

        task = asyncio.create_task(follow())
        await held.wait()
        await s.append({"type": "D"})  # 5, durable
        await s.append({"type": "E", "ephemeral": True})  # 6, ephemeral
        gate.set()
        await asyncio.wait_for(task, 20)
        assert got == [5, 6]


async def test_read_during_first_ephemeral_commit_returns_durable_events(y, tenant):
    s = y.stream("/first", tenant=tenant)
    await s.append_many([{"type": "d"}] * 5)
    pending = asyncio.create_task(s.append({"type": "e", "ephemeral": True}))
    await asyncio.sleep(0)  # let the commit start (no ordering depends on it)
    events = await s.read(include_ephemeral=True)
    assert [e.offset for e in events][:5] == [1, 2, 3, 4, 5]
    await pending
