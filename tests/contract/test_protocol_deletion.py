"""Durable Streams deletion, forks and expiry through ``ProtocolStreams``
(``runtime.protocol_streams``), on both backends: a legal hold is absolute
(no deletion, no mark, no expiry, forks or not), and the fork chain still
deletes what it may."""

from __future__ import annotations

import pytest

from yoke import errors
from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.durable_streams import CreateSpec
from yoke.streams.rules import APPLICATION, DELETE, READ, Caller

GENERIC = Caller.generic(("admin",))


def spec(**kw) -> CreateSpec:
    return CreateSpec(content_type="application/json", **kw)


async def create(y, tenant, path, **kw):
    events = [prepare({"type": "ds.message", "payload": {"n": i}}) for i in range(2)]
    stream, created = await y.protocol_streams.create(tenant, path, GENERIC, spec(events=events, **kw))
    assert created
    return stream


async def hold(y, tenant, path, on=True):
    await y.stream(path, tenant).set_legal_hold(on)


async def state(y, tenant, path) -> str:
    """live, deleted (marked, forks live on) or missing."""
    try:
        await y.protocol_streams.lookup(tenant, path, GENERIC, READ, touch=False)
    except errors.StreamNotFound:
        return "missing"
    except errors.StreamDeleted:
        return "deleted"
    return "live"


async def test_a_held_stream_with_forks_is_neither_deleted_nor_marked(y, tenant):
    await create(y, tenant, "/a")
    await create(y, tenant, "/b", fork_of="/a")
    await hold(y, tenant, "/a")
    with pytest.raises(errors.LegalHold):
        await y.protocol_streams.delete(tenant, "/a", GENERIC)
    assert await state(y, tenant, "/a") == "live"
    assert len(await y.stream("/a", tenant).read()) == 2
    # Its unheld fork is deleted as usual, and the held source stays.
    assert await y.protocol_streams.delete(tenant, "/b", GENERIC) == ["/b"]
    assert (await state(y, tenant, "/b"), await state(y, tenant, "/a")) == ("missing", "live")
    await hold(y, tenant, "/a", False)
    assert await y.protocol_streams.delete(tenant, "/a", GENERIC) == ["/a"]
    assert await state(y, tenant, "/a") == "missing"


async def test_a_held_stream_without_forks_is_kept(y, tenant):
    await create(y, tenant, "/solo")
    await hold(y, tenant, "/solo")
    with pytest.raises(errors.LegalHold):
        await y.protocol_streams.delete(tenant, "/solo", GENERIC)
    assert await state(y, tenant, "/solo") == "live"


async def test_a_chain_of_forks_stops_at_a_source_held_after_it_was_marked(y, tenant):
    # a <- b <- c; a and b marked deleted while c lives; then a is held.
    await create(y, tenant, "/a")
    await create(y, tenant, "/b", fork_of="/a")
    await create(y, tenant, "/c", fork_of="/b")
    assert await y.protocol_streams.delete(tenant, "/a", GENERIC) == ["/a"]
    assert await y.protocol_streams.delete(tenant, "/b", GENERIC) == ["/b"]
    assert (await state(y, tenant, "/a"), await state(y, tenant, "/b")) == ("deleted", "deleted")
    await hold(y, tenant, "/a")
    # c goes, and with it b (no fork of it left); a stays, marked and held.
    assert await y.protocol_streams.delete(tenant, "/c", GENERIC) == ["/c", "/b"]
    assert [await state(y, tenant, p) for p in ("/a", "/b", "/c")] == ["deleted", "missing", "missing"]
    assert len(await y.stream("/a", tenant).read()) == 2  # its records are all there
    await hold(y, tenant, "/a", False)


async def test_a_chain_without_holds_is_deleted_whole(y, tenant):
    await create(y, tenant, "/a")
    await create(y, tenant, "/b", fork_of="/a")
    await create(y, tenant, "/c", fork_of="/b")
    assert await y.protocol_streams.delete(tenant, "/a", GENERIC) == ["/a"]
    assert await y.protocol_streams.delete(tenant, "/b", GENERIC) == ["/b"]
    assert await y.protocol_streams.delete(tenant, "/c", GENERIC) == ["/c", "/b", "/a"]
    assert [await state(y, tenant, p) for p in ("/a", "/b", "/c")] == ["missing"] * 3


async def test_a_held_stream_does_not_expire(y, tenant):
    # Already past its expiry time when created: found expired at once.
    await create(y, tenant, "/ttl", expires_at="then", expires_ms=now_ms() - 1)
    await create(y, tenant, "/ttl-free", expires_at="then", expires_ms=now_ms() - 1)
    await hold(y, tenant, "/ttl")
    assert await state(y, tenant, "/ttl") == "live"
    assert len(await y.stream("/ttl", tenant).read()) == 2
    assert await state(y, tenant, "/ttl-free") == "missing"
    await hold(y, tenant, "/ttl", False)
    assert await state(y, tenant, "/ttl") == "missing"


async def test_a_native_stream_with_forks_is_marked_deleted(y, tenant):
    """A stream made through Yoke's own API has no protocol row: deleting it
    while a fork lives marks it all the same (it used to answer 204 and
    change nothing)."""
    await y.stream("/native", tenant).append({"type": "x"})
    await create(y, tenant, "/fork", fork_of="/native")
    assert await y.protocol_streams.delete(tenant, "/native", GENERIC) == ["/native"]
    assert await state(y, tenant, "/native") == "deleted"
    assert await y.protocol_streams.delete(tenant, "/fork", GENERIC) == ["/fork", "/native"]
    assert await state(y, tenant, "/native") == "missing"


async def test_pinned_streams_are_refused_to_the_protocol(y, tenant):
    from yoke.streams.data_handling import DataHandling

    pins = DataHandling.from_body({"redaction": [{"path": "$.payload.s", "lifted_by": ["pii:read"]}]})
    await y.stream("/runs/r1/answer", tenant).create_if_missing(pinned=True, data_handling=pins)
    for call in (
        y.protocol_streams.lookup(tenant, "/runs/r1/answer", GENERIC, READ),
        y.protocol_streams.delete(tenant, "/runs/r1/answer", GENERIC),
        y.protocol_streams.existing(tenant, "/runs/r1/answer", GENERIC),
        y.protocol_streams.fork_source(tenant, "/runs/r1/answer", GENERIC),
        y.protocol_streams.create(tenant, "/copy", GENERIC, spec(fork_of="/runs/r1/answer")),
    ):
        with pytest.raises(errors.DataHandlingPinned):
            await call
    assert await state(y, tenant, "/copy") == "missing"
    # The application itself may (it owns the database).
    await y.protocol_streams.lookup(tenant, "/runs/r1/answer", APPLICATION, DELETE)
