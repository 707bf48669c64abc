"""The Durable Streams sub-store (``store.protocol``) on both drivers:
create with protocol settings and forks, guards decided in the append's
transaction (producer sequence, Stream-Seq, close, lifetime), soft delete."""

from __future__ import annotations

from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.durable_streams import CreateSpec, Guard

from .conftest import new_id

JSON = "application/json"


def message(n: int):
    return prepare({"type": "ds.message", "payload": {"n": n}})


async def guarded(store, tenant, path, guards):
    events = [message(i) for i in range(len(guards))]
    return await store.commit(tenant, path, events, list(range(len(guards))), now_ms(), new_id(), guards)


async def test_create_once_with_initial_messages(store, tenant):
    spec = CreateSpec(content_type=JSON, ttl_s=60, events=[message(0), message(1)])
    stream, created = await store.protocol.create(tenant, "/ds", new_id(), now_ms(), spec)
    assert created and (stream.head, stream.content_type, stream.ttl_s, stream.closed) == (2, JSON, 60, False)
    again, created = await store.protocol.create(tenant, "/ds", new_id(), now_ms(), CreateSpec(content_type=JSON))
    assert not created and again.stream_id == stream.stream_id
    found = await store.protocol.stream(tenant, "/ds")
    assert (found.sid, found.head) == (stream.sid, 2)
    assert await store.protocol.stream(tenant, "/none") is None
    await store.protocol.touch(tenant, stream.sid, now_ms() + 1000)
    assert (await store.protocol.stream(tenant, "/ds")).touched_ms >= found.touched_ms


async def test_a_fork_copies_its_source_up_to_the_offset(store, tenant):
    spec = CreateSpec(content_type=JSON, events=[message(i) for i in range(3)])
    await store.protocol.create(tenant, "/src", new_id(), now_ms(), spec)
    fork, created = await store.protocol.create(
        tenant, "/fork", new_id(), now_ms(), CreateSpec(content_type=None, fork_of="/src", fork_offset=2)
    )
    assert created and (fork.fork_of, fork.fork_offset, fork.head, fork.content_type) == ("/src", 2, 2, JSON)
    assert [e.payload for e in (await store.read(tenant, "/fork", 0, 10)).events] == [{"n": 0}, {"n": 1}]
    assert await store.protocol.forks(tenant, "/src") == 1


async def test_producer_guards(store, tenant):
    await store.protocol.create(tenant, "/p", new_id(), now_ms(), CreateSpec(content_type=JSON))
    first = await guarded(store, tenant, "/p", [Guard(producer=("w", 0, 0)), Guard(producer=("w", 0, 1))])
    assert [g.status for g in first.guards] == ["ok", "ok"] and first.head == 2
    repeat = await guarded(store, tenant, "/p", [Guard(producer=("w", 0, 1))])
    assert [g.status for g in repeat.guards] == ["duplicate"] and repeat.guards[0].last_seq == 1
    gap = await guarded(store, tenant, "/p", [Guard(producer=("w", 0, 5))])
    assert (gap.guards[0].status, gap.guards[0].expected_seq, gap.guards[0].received_seq) == ("seq_gap", 2, 5)
    newer = await guarded(store, tenant, "/p", [Guard(producer=("w", 1, 0))])
    assert newer.guards[0].status == "ok"
    stale = await guarded(store, tenant, "/p", [Guard(producer=("w", 0, 2))])
    assert (stale.guards[0].status, stale.guards[0].epoch) == ("stale_epoch", 1)
    assert [o.status for o in stale.outcomes] == ["guarded"]
    assert (await store.info(tenant, "/p")).head == 3


async def test_stream_seq_and_close(store, tenant):
    stream, _ = await store.protocol.create(tenant, "/s", new_id(), now_ms(), CreateSpec(content_type=JSON))
    assert (await guarded(store, tenant, "/s", [Guard(stream_seq="b")])).guards[0].status == "ok"
    assert (await guarded(store, tenant, "/s", [Guard(stream_seq="a")])).guards[0].status == "stream_seq"
    closing = await guarded(store, tenant, "/s", [Guard(close=True, stream_id=stream.stream_id)])
    assert closing.guards[0].closed and (await store.protocol.stream(tenant, "/s")).closed
    assert (await guarded(store, tenant, "/s", [Guard()])).guards[0].status == "closed"
    assert (await guarded(store, tenant, "/s", [Guard(stream_id="another")])).guards[0].status == "gone"


async def test_soft_delete_keeps_the_source_of_live_forks(store, tenant):
    source, _ = await store.protocol.create(tenant, "/src", new_id(), now_ms(), CreateSpec(content_type=JSON, events=[message(0)]))
    await store.protocol.create(tenant, "/fork", new_id(), now_ms(), CreateSpec(content_type=None, fork_of="/src"))
    await store.protocol.soft_delete(tenant, source.sid, now_ms())
    assert (await store.protocol.stream(tenant, "/src")).deleted
    assert (await guarded(store, tenant, "/src", [Guard(stream_id=source.stream_id)])).guards[0].status == "gone"
    assert [e.payload for e in (await store.read(tenant, "/fork", 0, 10)).events] == [{"n": 0}]
