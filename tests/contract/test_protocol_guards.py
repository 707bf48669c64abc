"""A protocol append's lifetime guard (``Guard.stream_id``), on both
backends: the route decides an append for the stream it looked up (or
remembered); the store takes it only into that lifetime, not soft-deleted,
and refuses it as "gone" otherwise, batch by batch, writing nothing for it."""

from __future__ import annotations

import pytest

from yoke import errors
from tests.conftest import now_ms
from yoke.http.durable_streams.messages import message_event
from yoke.store.durable_streams import CreateSpec, Guard

JSON = CreateSpec(content_type="application/json")


async def _create(y, tenant: str, path: str, stream_id: str):  # noqa: ANN001, ANN202
    stream, created = await y.store.protocol.create(tenant, path, stream_id, now_ms(), JSON)
    assert created
    return stream


async def _commit(y, tenant: str, path: str, guards: list[Guard]):  # noqa: ANN001, ANN202
    events = [message_event(f'{{"batch":{i}}}') for i in range(len(guards))]
    return await y.store.commit(tenant, path, events, list(range(len(guards))), now_ms(), "unused", guards)


async def test_the_looked_up_lifetime_takes_the_append(y, tenant):
    stream = await _create(y, tenant, "/life", "life-1")
    result = await _commit(y, tenant, "/life", [Guard(stream_id=stream.stream_id)])
    assert [g.status for g in result.guards] == ["ok"]
    assert result.outcomes[0].offset == 1
    result = await _commit(y, tenant, "/life", [Guard(stream_id=stream.stream_id), None])
    assert [o.offset for o in result.outcomes] == [2, 3]


async def test_another_lifetime_is_gone_batch_by_batch(y, tenant):
    stream = await _create(y, tenant, "/life", "life-1")
    result = await _commit(y, tenant, "/life", [Guard(stream_id="an-earlier-lifetime")])
    assert [g.status for g in result.guards] == ["gone"]
    assert result.outcomes[0].status == "guarded"
    # In one commit, the current lifetime's batch is taken and the other's not.
    result = await _commit(y, tenant, "/life", [Guard(stream_id="an-earlier-lifetime"), Guard(stream_id=stream.stream_id)])
    assert [g.status for g in result.guards] == ["gone", "ok"]
    assert [o.status for o in result.outcomes] == ["guarded", "ok"]
    assert result.outcomes[1].offset == 1
    # A close for another lifetime does not close this one.
    result = await _commit(y, tenant, "/life", [Guard(close=True, stream_id="an-earlier-lifetime")])
    assert [g.status for g in result.guards] == ["gone"]
    read = await y.stream("/life", tenant=tenant).read()
    assert [e.payload for e in read] == [{"batch": 1}]
    assert not (await y.store.protocol.stream(tenant, "/life")).closed


async def test_a_deleted_and_recreated_path_refuses_the_old_lifetime(y, tenant):
    old = await _create(y, tenant, "/again", "again-1")
    assert (await _commit(y, tenant, "/again", [Guard(stream_id=old.stream_id)])).guards[0].status == "ok"
    await y.stream("/again", tenant=tenant).delete()
    with pytest.raises(errors.StreamNotFound):  # nothing is created for it
        await _commit(y, tenant, "/again", [Guard(stream_id=old.stream_id)])
    assert await y.store.protocol.stream(tenant, "/again") is None
    new = await _create(y, tenant, "/again", "again-2")
    assert (await _commit(y, tenant, "/again", [Guard(stream_id=old.stream_id)])).guards[0].status == "gone"
    assert (await _commit(y, tenant, "/again", [Guard(stream_id=new.stream_id)])).outcomes[0].offset == 1


async def test_a_soft_deleted_stream_is_gone(y, tenant):
    stream = await _create(y, tenant, "/soft", "soft-1")
    # Twice: the SQLite writer notes the lifetime in its copy of the row.
    for offset in (1, 2):
        assert (await _commit(y, tenant, "/soft", [Guard(stream_id=stream.stream_id)])).outcomes[0].offset == offset
    await y.store.protocol.soft_delete(tenant, stream.sid, now_ms())
    result = await _commit(y, tenant, "/soft", [Guard(stream_id=stream.stream_id)])
    assert [g.status for g in result.guards] == ["gone"]
    assert (await y.stream("/soft", tenant=tenant).info()).head == 2
