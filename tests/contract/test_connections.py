"""Session connections (Stream.open_connection): replay then live, the
common filter, state updates, replacement by key, ends and their facts;
nothing appended to the stream. Both backends."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors

WAIT_S = 20


class Collector:
    def __init__(self) -> None:
        self.batches: asyncio.Queue = asyncio.Queue()

    async def __call__(self, batch) -> None:  # noqa: ANN001
        await self.batches.put(batch)

    async def events(self, count: int) -> list:
        got: list = []
        async with asyncio.timeout(WAIT_S):
            while len(got) < count:
                got.extend(await self.batches.get())
        return got

    async def next(self):  # noqa: ANN201
        async with asyncio.timeout(WAIT_S):
            return await self.batches.get()


async def connection_facts(y, tenant: str) -> list:  # noqa: ANN001
    return [e for e in await y.stream("/", tenant).read(limit=10_000) if e.type.startswith("yoke.stream.connection")]


async def test_replay_then_live_with_the_filter_and_nothing_appended(y, tenant):
    s = y.stream("/chat", tenant)
    await s.append_many([{"type": "msg", "payload": {"n": 1, "visible": True}}, {"type": "other"},
                         {"type": "msg", "payload": {"n": 2, "visible": False}}])
    got = Collector()
    conn = await s.open_connection(
        connection_key="browser", replay_after=0, on_batch=got,
        filter={"types": ["msg"], "where": "payload.visible = true"},
    )
    assert [e.payload["n"] for e in await got.events(1)] == [1]
    await s.append({"type": "msg", "payload": {"n": 3, "visible": True}, "ephemeral": True})
    await s.append({"type": "msg", "payload": {"n": 4, "visible": True}})
    live = await got.events(2)
    assert [(e.payload["n"], e.ephemeral) for e in live] == [(3, True), (4, False)]
    await conn.close()
    assert await conn.wait() == "closed" and conn.closed
    await s.append({"type": "msg", "payload": {"n": 5, "visible": True}})
    assert got.batches.empty()
    # No subscription, nothing on the stream itself.
    assert await s.subscriptions() == []
    assert not [e for e in await s.read() if e.type.startswith("yoke.")]
    opened, closed = await connection_facts(y, tenant)
    info = await s.info()
    assert opened.type == "yoke.stream.connection_opened"
    assert opened.payload == {
        "path": "/chat", "stream_id": info.stream_id, "connection_key": "browser",
        "connection_id": conn.id, "replay_after": 0, "events": True,
    }
    assert closed.type == "yoke.stream.connection_closed"
    assert closed.payload["reason"] == "closed" and closed.payload["connection_id"] == conn.id


async def test_without_replay_only_new_events_and_async_with(y, tenant):
    s = y.stream("/live", tenant)
    await s.append({"type": "old"})
    got = Collector()
    async with await s.open_connection(connection_key="k", on_batch=got) as conn:
        await s.append({"type": "new"})
        assert [e.type for e in await got.events(1)] == ["new"]
    assert conn.reason == "closed"


async def test_the_same_key_replaces_the_first_connection(y, tenant):
    s = y.stream("/tabs", tenant)
    first, second, other = Collector(), Collector(), Collector()
    a = await s.open_connection(connection_key="tab", on_batch=first)
    c = await s.open_connection(connection_key="tab-2", on_batch=other)
    b = await s.open_connection(connection_key="tab", on_batch=second)
    assert await a.wait() == "replaced"
    await s.append({"type": "x"})
    assert [e.type for e in await second.events(1)] == ["x"]
    assert [e.type for e in await other.events(1)] == ["x"]  # another key is left alone
    assert first.batches.empty()
    await b.close()
    await c.close()
    reasons = [(f.payload["connection_id"], f.payload.get("reason")) for f in await connection_facts(y, tenant)
               if f.type.endswith("closed")]
    assert (a.id, "replaced") in reasons and (b.id, "closed") in reasons


async def test_the_same_key_in_another_process_replaces_it(db_url, tenant):
    """Two runtimes on one database stand for two processes: the later
    connection_opened fact on '/' ends the earlier connection."""
    async with yoke.open(db_url, executor=False) as one, yoke.open(db_url, executor=False) as two:
        first, second = Collector(), Collector()
        a = await one.stream("/shared", tenant).open_connection(connection_key="tab", on_batch=first)
        b = await two.stream("/shared", tenant).open_connection(connection_key="tab", on_batch=second)
        other = await one.stream("/shared", tenant).open_connection(connection_key="other", on_batch=first)
        async with asyncio.timeout(WAIT_S):
            assert await a.wait() == "replaced"
        assert not b.closed and not other.closed
        await two.stream("/shared", tenant).append({"type": "x"})
        assert [e.type for e in await second.events(1)] == ["x"]
        await b.close()
        await other.close()


async def test_a_failing_callback_and_a_closed_stream_end_it(y, tenant):
    s = y.stream("/ends", tenant)

    async def broken(batch):  # noqa: ANN001
        raise ValueError("no room")

    failing = await s.open_connection(connection_key="f", on_batch=broken, replay_after=0)
    got = Collector()
    ending = await s.open_connection(connection_key="e", on_batch=got)
    await s.append({"type": "x"})
    async with asyncio.timeout(WAIT_S):
        assert await failing.wait() == "failed"
    assert "ValueError" in failing.error.message and "no room" in failing.error.message
    await s.append({"type": "last"})
    await s.close()
    assert [e.type for e in await got.events(2)] == ["x", "last"]  # everything, then the end
    async with asyncio.timeout(WAIT_S):
        assert await ending.wait() == "stream_closed"
    closed = {f.payload["connection_key"]: f.payload for f in await connection_facts(y, tenant)
              if f.type.endswith("closed")}
    assert closed["f"]["reason"] == "failed" and "no room" in closed["f"]["error"]["message"]
    assert closed["e"]["reason"] == "stream_closed"


async def test_deleting_the_stream_ends_it(y, tenant):
    s = y.stream("/doomed", tenant)
    await s.append({"type": "x"})
    got = Collector()
    conn = await s.open_connection(connection_key="k", on_batch=got, replay_after=0)
    assert [e.type for e in await got.events(1)] == ["x"]
    await s.delete()
    async with asyncio.timeout(WAIT_S):
        assert await conn.wait() == "stream_deleted"
    [closed] = [f for f in await connection_facts(y, tenant) if f.type.endswith("closed")]
    assert closed.payload["reason"] == "stream_deleted"


async def test_state_updates_instead_of_events(y, tenant):
    s = y.stream("/agents/reviewer", tenant)
    await s.append({"type": "hello"})
    got = Collector()
    conn = await s.open_connection(connection_key="ui", on_batch=got, events=False)
    first = await got.next()
    assert first == {
        "path": "/agents/reviewer",
        "subscriptions": {"inbound": {"by_source_path": {}}, "outbound": {"by_name": {}}},
        "processors": {},
    }
    sub = await s.subscribe("mirror", yoke.copy_to_stream("/mirror"), filter={"types": ["nothing"]})
    update = await got.next()
    mirror = update["subscriptions"]["outbound"]["by_name"]["mirror"]
    assert mirror["configured_at_offset"] == sub.offset and mirror["configuration"]["target"] == "/mirror"
    assert mirror["delivery_halted"] is None
    await s.append({"type": "plain"})  # the state does not change: nothing sent
    await s.unsubscribe("mirror")
    assert (await got.next())["subscriptions"]["outbound"]["by_name"] == {}
    await conn.close()
    assert got.batches.empty()


async def test_bad_input_is_refused_before_anything_opens(y, tenant):
    s = y.stream("/bad", tenant)
    await s.append({"type": "x"})
    got = Collector()
    for key in ("", "k" * 201, 5, "a\x00"):
        with pytest.raises(errors.InvalidInput):
            await s.open_connection(connection_key=key, on_batch=got)
    with pytest.raises(errors.InvalidInput):
        await s.open_connection(connection_key="k", on_batch=lambda batch: None)
    with pytest.raises(errors.InvalidCursor):
        await s.open_connection(connection_key="k", on_batch=got, replay_after=5)
    with pytest.raises(errors.InvalidFilter):
        await s.open_connection(connection_key="k", on_batch=got, filter={"where": "payload.("})
    with pytest.raises(errors.InvalidFilter):
        await s.open_connection(connection_key="k", on_batch=got, filter={"types": ["x"], "key": "payload.k"})
    assert await connection_facts(y, tenant) == []
    assert len(y.connections) == 0


async def test_an_opening_that_cannot_be_recorded_leaves_nothing_behind(y, tenant):
    """The opened fact is written before the connection runs: when the
    database refuses it, the call fails and the key is free again."""
    s = y.stream("/flaky", tenant)
    store = y.store
    real = store.append_fact

    async def unavailable(*args, **kwargs):  # noqa: ANN002, ANN003
        raise errors.Unavailable("the database is away", reason="connect_failed")

    store.append_fact = unavailable
    try:
        with pytest.raises(errors.Unavailable):
            await s.open_connection(connection_key="k", on_batch=Collector())
    finally:
        store.append_fact = real
    assert len(y.connections) == 0
    got = Collector()
    async with asyncio.timeout(WAIT_S):
        async with await s.open_connection(connection_key="k", on_batch=got):
            await s.append({"type": "x"})
            assert [e.type for e in await got.events(1)] == ["x"]
