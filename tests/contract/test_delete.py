"""Deleting a stream: one transaction removes everything kept for it; the
path can be created again as a new stream; tails of the old one end."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

import yoke
from yoke import errors

DATA = b"object bytes " * 100
DIGEST = hashlib.sha256(DATA).hexdigest()


async def _object(s):  # noqa: ANN001
    o = await s.objects.prepare(idempotency_key="o1", sha256=DIGEST, size=len(DATA), content_type="text/plain")
    await s.objects.upload(o.object_id, DATA)
    await s.objects.commit(o.object_id, type="file.ready")
    return o


async def test_delete_removes_everything_and_the_path_starts_again(y, tenant, backend, db_url):
    s = y.stream("/doomed", tenant=tenant)
    first = await s.append({"type": "a", "idempotency_key": "k1"})
    await s.append_many([{"type": "b"}] * 3)
    await s.ack("reader", 2)
    o = await _object(s)
    await s.subscribe("out", yoke.copy_to_stream("/elsewhere"))
    other = y.stream("/kept", tenant=tenant)
    await other.append({"type": "untouched"})
    before = await s.info()
    if backend == "sqlite":
        files = list((Path(db_url.removeprefix("sqlite:///")).parent / "objects" / tenant).rglob(o.object_id))
        assert len(files) == 1

    deleted = await s.delete()
    assert (deleted.stream_id, deleted.head) == (before.stream_id, before.head)
    with pytest.raises(errors.StreamNotFound):
        await s.info()
    page = await s.read_page()
    assert not page.exists and page.events == []
    assert await s.consumers() == []
    assert await s.subscriptions() == []
    with pytest.raises(errors.ObjectNotFound):
        await s.objects.info(o.object_id)
    assert await y.store.object_data(tenant, "/doomed", o.object_id) is None
    if backend == "sqlite":
        assert not files[0].exists()  # the bytes went with the row
    assert [e.type for e in await other.read()] == ["untouched"]
    with pytest.raises(errors.StreamNotFound):
        await s.delete()

    # The same path, a new stream: new lifetime, offsets from 1, old keys forgotten.
    again = await s.append({"type": "a", "idempotency_key": "k1"})
    info = await s.info()
    assert info.stream_id != before.stream_id and info.created_at > before.created_at
    assert again.offset == 1 and again.id != first.id
    assert [e.type for e in await s.read()] == ["a"]
    assert await s.consumers() == []
    assert info.usage.durable_events == 1 and info.usage.min_ack is None


async def test_legal_hold_refuses_deletion_and_keeps_everything(y, tenant):
    s = y.stream("/held", tenant=tenant)
    await s.append_many([{"type": "a"}] * 2)
    await s.set_legal_hold(True)
    with pytest.raises(errors.LegalHold) as caught:
        await s.delete()
    assert caught.value.code == "legal_hold" and caught.value.http_status == 409
    assert len(await s.read()) == 2 and (await s.info()).legal_hold
    await s.set_legal_hold(False)
    await s.delete()
    with pytest.raises(errors.StreamNotFound):
        await s.info()


async def test_the_global_stream_is_kept(y, tenant):
    root = y.stream("/", tenant=tenant)
    await root.append({"type": "tenant.fact"})
    with pytest.raises(errors.GlobalStreamKept) as caught:
        await root.delete()
    assert caught.value.code == "global_stream" and caught.value.http_status == 400
    assert len(await root.read()) == 1


async def test_deleting_a_missing_stream_is_not_found(y, tenant):
    with pytest.raises(errors.StreamNotFound):
        await y.stream("/never", tenant=tenant).delete()


async def test_a_tail_ends_when_its_stream_is_deleted(y, tenant):
    s = y.stream("/tailed", tenant=tenant)
    await s.append({"type": "a"})
    tail = s.tail()
    assert (await anext(tail)).offset == 1
    pending = asyncio.ensure_future(anext(tail))  # waiting for the next event
    await asyncio.sleep(0)
    await s.delete()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(pending, 20)


async def test_a_tail_does_not_run_on_into_the_recreated_stream(y, tenant):
    s = y.stream("/reborn", tenant=tenant)
    await s.append_many([{"type": "old"}] * 2)
    tail = s.tail()
    assert (await anext(tail)).offset == 1
    # The tail holds offset 2 in its page; deleted and created again with
    # more events before it reads on, it must not continue into them.
    assert (await anext(tail)).offset == 2
    await s.delete()
    await s.append_many([{"type": "new"}] * 5)
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(anext(tail), 20)
    assert [e.type for e in await s.read()] == ["new"] * 5


async def test_buffered_ephemeral_events_go_with_the_stream(y, tenant):
    s = y.stream("/eph", tenant=tenant)
    await s.append({"type": "durable"})
    await s.append_many([{"type": "partial", "ephemeral": True}] * 3)  # offsets 2..4, buffered
    before = y.buffers.bytes
    assert before > 0
    await s.delete()
    assert y.buffers.get(tenant, "/eph") is None and y.buffers.bytes == 0
    await s.append_many([{"type": "fresh"}] * 4)
    events = await s.read(include_ephemeral=True)
    assert [(e.offset, e.type) for e in events] == [(i, "fresh") for i in range(1, 5)]


async def test_processor_checkpoints_and_receiver_fences_go(y, tenant):
    src = y.stream("/source", tenant=tenant)
    dst = y.stream("/target", tenant=tenant)
    await src.subscribe("c", yoke.copy_to_stream("/target"), start="beginning")
    last = await src.append({"type": "x"})
    await src.wait_until_processed("c", last.offset)
    assert [r.source_path for r in await y.store.subscriptions.inbound(tenant, "/target")] == ["/source"]
    # Deleting the receiver drops the fence records it keeps; the source's
    # subscription lives on and copies into the new /target.
    await dst.delete()
    assert await y.store.subscriptions.inbound(tenant, "/target") == []
    last = await src.append({"type": "x"})
    await src.wait_until_processed("c", last.offset)
    assert [e.type for e in await dst.read()] == ["x"]
    # Deleting the source drops its subscriptions; /target's record of the
    # old lifetime stays (it is what fences a late batch of that lifetime).
    await src.delete()
    assert await y.store.subscriptions.get(tenant, "/source", "c") is None
    assert await y.store.subscriptions.checkpoint(tenant, "/source", "c") is None
    assert len(await y.store.subscriptions.inbound(tenant, "/target")) == 1


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_tail_in_another_process_ends(db_url, tenant):
    async with yoke.open(db_url) as a, yoke.open(db_url) as b:
        s = a.stream("/shared", tenant=tenant)
        await s.append({"type": "a"})
        tail = b.stream("/shared", tenant=tenant).tail()
        assert (await anext(tail)).offset == 1
        pending = asyncio.ensure_future(anext(tail))
        await asyncio.sleep(0)
        await s.delete()  # b hears of it through NOTIFY
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(pending, 20)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_ephemeral_events_relayed_to_another_process_go_with_the_stream(db_url, tenant):
    async with yoke.open(db_url) as a, yoke.open(db_url) as b:
        s, seen_by_b = a.stream("/relayed", tenant=tenant), b.stream("/relayed", tenant=tenant)
        await s.append({"type": "durable"})
        await s.append_many([{"type": "partial", "ephemeral": True}] * 3)  # 2..4, relayed to b
        assert [e.type for e in await seen_by_b.read(include_ephemeral=True)] == ["durable"] + ["partial"] * 3
        await s.delete()  # b keeps what it was relayed until it reads the new stream
        await s.append_many([{"type": "fresh"}] * 4)
        events = await seen_by_b.read(include_ephemeral=True)
        assert [(e.offset, e.type) for e in events] == [(i, "fresh") for i in range(1, 5)]
