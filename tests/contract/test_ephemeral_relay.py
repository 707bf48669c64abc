"""Ephemeral events across processes (the relay):
on PostgreSQL an ephemeral event appended through one runtime reaches the
reads and tails of every other, in offset order with the durable events,
under the reader's own caps; a restart forgets them. Two runtimes here
have their own pools and listeners, as two processes do
(tests/http/test_ephemeral_processes.py runs real ``yoke serve`` processes).
On SQLite one process owns the file and nothing is relayed."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke.store.postgres.relay import PIECE_BYTES

KIB = 1024


def eph(i: int, payload: object = None) -> dict:
    return {"type": "chunk", "payload": {"i": i} if payload is None else payload, "ephemeral": True}


def dur(i: int) -> dict:
    return {"type": "durable", "payload": {"i": i}}


def view(events: list[yoke.Event]) -> list[tuple]:
    return [(e.offset, e.type, e.payload, e.metadata, e.source, e.ephemeral, e.at, e.id) for e in events]


async def collect(stream: yoke.Stream, count: int, after: int = 0) -> list[yoke.Event]:
    got: list[yoke.Event] = []
    async for event in stream.tail(after=after):
        got.append(event)
        if len(got) == count:
            break
    return got


@pytest.fixture
async def pair(pg_url):
    async with yoke.open(pg_url) as a, yoke.open(pg_url) as b:
        yield a, b


async def test_sqlite_relays_nothing(tmp_path):
    async with yoke.open(f"sqlite:///{tmp_path}/y.db") as y:
        assert y.store.relays_ephemeral is False
        s = y.stream("/s")
        await s.append(eph(1))
        assert [e.ephemeral for e in await s.read(include_ephemeral=True)] == [True]
        assert y.relay.barriers == 0


async def test_a_tail_elsewhere_gets_them_in_offset_order(pair, tenant):
    a, b = pair
    sa, sb = a.stream("/room", tenant), b.stream("/room", tenant)
    await sa.append(dur(0))
    tail = asyncio.create_task(collect(sb, 12))
    while not b.hub.streams:  # the tail has subscribed
        await asyncio.sleep(0.01)
    for i in range(1, 12):
        await (sa.append(eph(i)) if i % 3 else sa.append(dur(i)))
    got = await asyncio.wait_for(tail, 30)
    expected = await sa.read(include_ephemeral=True)
    assert view(got) == view(expected)
    assert [e.offset for e in got] == list(range(1, 13))
    assert b.relay.received == 8
    # A read and a point read elsewhere see them too.
    assert view(await sb.read(include_ephemeral=True)) == view(expected)
    assert view([await sb.get(2)]) == view([expected[1]])
    assert [e.ephemeral for e in await sb.read()] == [False] * 4


async def test_writers_in_both_processes_on_one_stream(pair, tenant):
    a, b = pair
    sa, sb = a.stream("/both", tenant), b.stream("/both", tenant)
    await sa.append(dur(0))
    tails = [asyncio.create_task(collect(s, 201)) for s in (sa, sb)]
    while not (a.hub.streams and b.hub.streams):
        await asyncio.sleep(0.01)

    async def write(stream: yoke.Stream, base: int) -> None:
        for i in range(100):
            await stream.append(eph(base + i))

    await asyncio.gather(write(sa, 0), write(sb, 1000))
    for got in await asyncio.wait_for(asyncio.gather(*tails), 60):
        assert [e.offset for e in got] == list(range(1, 202))
        assert sorted(e.payload["i"] for e in got if e.ephemeral) == [*range(100), *range(1000, 1100)]
    assert view(await sa.read(include_ephemeral=True)) == view(await sb.read(include_ephemeral=True))


async def test_large_events_travel_in_chunks_unchanged(pair, tenant):
    a, b = pair
    sa, sb = a.stream("/big", tenant), b.stream("/big", tenant)
    await sa.append(dur(0))
    tail = asyncio.create_task(collect(sb, 3))
    while not b.hub.streams:
        await asyncio.sleep(0.01)
    text = "é€𝄞x:" * 4000  # 44 KB of mixed 1- to 4-byte characters, across many pieces
    assert len(text.encode()) > 5 * PIECE_BYTES
    await sa.append_many([
        {"type": "big", "payload": {"t": text, "f": 1e18, "n": -0.0}, "metadata": {"m": "ü" * 1000},
         "source": {"s": ":" * 2000}, "correlation": "c:1", "priority": 3, "group_id": "g",
         "ephemeral": True},
        {"type": "small", "payload": None, "ephemeral": True},
    ])
    got = await asyncio.wait_for(tail, 30)
    assert view(got) == view(await sa.read(include_ephemeral=True))
    assert got[1].payload["t"] == text and (got[1].correlation, got[1].priority, got[1].group_id) == ("c:1", 3, "g")


async def test_events_from_before_a_process_listened_are_not_waited_for(pg_url, tenant):
    async with yoke.open(pg_url) as a:
        sa = a.stream("/old", tenant)
        await sa.append_many([eph(1), dur(2), eph(3)])
        async with yoke.open(pg_url) as b:
            sb = b.stream("/old", tenant)
            # Offsets 1 and 3 never reach b: one ping tells it so, once.
            assert [e.offset for e in await sb.read(include_ephemeral=True)] == [2]
            assert b.relay.barriers == 1
            assert [e.offset for e in await sb.read(include_ephemeral=True)] == [2]
            with pytest.raises(yoke.errors.EventNotFound):
                await sb.get(3)
            assert b.relay.barriers == 1
            await sa.append(eph(4))
            tail = [e async for e in _until(sb.tail(after=0), 4)]
            assert [(e.offset, e.ephemeral) for e in tail] == [(2, False), (4, True)]


async def _until(tail, offset: int):
    async for event in tail:
        yield event
        if event.offset >= offset:
            return


async def test_a_read_waits_for_an_event_still_on_its_way(pair, tenant):
    """The read sees the commit before its notification was handled: the
    barrier ping makes it wait for the event instead of passing its offset."""
    a, b = pair
    sa, sb = a.stream("/late", tenant), b.stream("/late", tenant)
    await sa.append(dur(0))
    listener = b.store.listener
    held: list[tuple] = []
    handle = listener._relayed

    def delayed(conn, pid, channel, payload):
        if payload.startswith("b:"):  # the ping: deliver what was held first, as PostgreSQL would
            for args in held:
                handle(*args)
            held.clear()
            handle(conn, pid, channel, payload)
        else:
            held.append((conn, pid, channel, payload))

    await listener._conn.remove_listener(listener.relay_channel, handle)
    await listener._conn.add_listener(listener.relay_channel, delayed)
    await sa.append(eph(1))
    await sa.append(dur(2))
    got = await sb.read(include_ephemeral=True)
    assert [(e.offset, e.ephemeral) for e in got] == [(1, False), (2, True), (3, False)]
    assert b.relay.barriers == 1


async def test_relayed_events_are_bounded_by_the_readers_caps(pg_url, tenant):
    caps = dict(ephemeral_buffer_bytes=8 * KIB, ephemeral_tenant_bytes=16 * KIB, ephemeral_process_bytes=24 * KIB)
    async with yoke.open(pg_url) as a, yoke.open(pg_url, **caps) as b:
        for r in range(6):
            stream = a.stream(f"/many/{r}", tenant)
            await stream.append_many([eph(i, payload={"pad": "x" * 500}) for i in range(40)])
        await a.stream("/many/last", tenant).append(dur(0))
        # Everything a sent has arrived once a barrier comes back.
        assert await b.store.ephemeral_barrier(30)
        assert b.relay.received == 240
        assert b.buffers.bytes <= caps["ephemeral_process_bytes"]
        assert max(b.buffers.tenants().values()) <= caps["ephemeral_tenant_bytes"]
        assert sum(b.buffers.evicted.values()) > 0
        # a keeps its own under its own (default) caps.
        assert len(await a.stream("/many/0", tenant).read(include_ephemeral=True)) == 40


async def test_refused_appends_relay_nothing_and_a_restart_forgets(pg_url, tenant):
    async with yoke.open(pg_url) as a:
        sa = a.stream("/closed", tenant)
        async with yoke.open(pg_url) as b:
            sb = b.stream("/closed", tenant)
            await sa.append(eph(1))
            await sa.append(dur(2))
            assert [e.offset for e in await sb.read(include_ephemeral=True)] == [1, 2]
            await sa.close()
            with pytest.raises(yoke.errors.StreamClosed):
                await sa.append(eph(3))
            assert await b.store.ephemeral_barrier(30)
            assert b.relay.received == 1
        async with yoke.open(pg_url) as b2:
            assert [e.offset for e in await b2.stream("/closed", tenant).read(include_ephemeral=True)] == [2]
        assert [e.offset for e in await sa.read(include_ephemeral=True)] == [1, 2]
