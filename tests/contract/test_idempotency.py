"""Idempotency keys: same key + same event → the original result, nothing appended."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors


async def test_same_key_same_event_returns_original(y, tenant):
    s = y.stream("/idem", tenant=tenant)
    event = {"type": "pay", "payload": {"amount": 5}, "idempotency_key": "pay-1"}
    first = await s.append(event)
    await s.append({"type": "other"})
    again = await s.append(dict(event))
    assert again == first
    assert [e.type for e in await s.read()] == ["pay", "other"]
    # Key order inside the payload does not make it a different event.
    reordered = {"type": "pay", "payload": {"amount": 5}, "idempotency_key": "pay-1", "metadata": {}}
    assert await s.append(reordered) == first


async def test_same_key_different_event_conflicts(y, tenant):
    s = y.stream("/idem", tenant=tenant)
    await s.append({"type": "pay", "payload": {"amount": 5}, "idempotency_key": "pay-1"})
    for changed in (
        {"type": "pay", "payload": {"amount": 6}},
        {"type": "refund", "payload": {"amount": 5}},
        {"type": "pay", "payload": {"amount": 5}, "priority": 1},
        {"type": "pay", "payload": {"amount": 5}, "metadata": {"x": 1}},
    ):
        with pytest.raises(errors.IdempotencyConflict) as exc:
            await s.append({**changed, "idempotency_key": "pay-1"})
        assert (exc.value.code, exc.value.http_status) == ("idempotency_conflict", 409)
    assert (await s.info()).head == 1


async def test_keys_are_scoped_to_the_stream(y, tenant):
    a = await y.stream("/a", tenant=tenant).append({"type": "x", "idempotency_key": "k"})
    b = await y.stream("/b", tenant=tenant).append({"type": "y", "idempotency_key": "k"})
    assert a.offset == b.offset == 1 and a.id != b.id


async def test_batch_with_repeated_key_is_invalid(y, tenant):
    s = y.stream("/rep", tenant=tenant)
    with pytest.raises(errors.InvalidIdempotencyKey):
        await s.append_many([{"type": "x", "idempotency_key": "k"}, {"type": "x", "idempotency_key": "k"}])


async def test_batch_mixing_new_and_duplicate_keys(y, tenant):
    s = y.stream("/mix", tenant=tenant)
    first = await s.append({"type": "x", "idempotency_key": "k1"})
    results = await s.append_many(
        [{"type": "x", "idempotency_key": "k1"}, {"type": "y", "idempotency_key": "k2"}, {"type": "z"}]
    )
    assert results[0] == first
    assert [r.offset for r in results[1:]] == [2, 3]


async def test_concurrent_retries_append_once(y, tenant):
    s = y.stream("/race", tenant=tenant)
    event = {"type": "order.placed", "payload": {"id": 1}, "idempotency_key": "order-1"}
    results = await asyncio.gather(*(s.append(dict(event)) for _ in range(30)))
    assert len(set(results)) == 1
    assert len(await s.read()) == 1


async def test_concurrent_retries_across_runtimes_append_once(db_url, tenant):
    async with yoke.open(db_url) as a, yoke.open(db_url) as b:
        event = {"type": "order.placed", "payload": {"id": 1}, "idempotency_key": "order-1"}
        calls = [rt.stream("/race", tenant=tenant).append(dict(event)) for rt in (a, b) * 10]
        calls += [a.stream("/race", tenant=tenant).append({"type": "noise"}) for _ in range(10)]
        results = await asyncio.gather(*calls)
        assert len(set(results[:20])) == 1
        events = await a.stream("/race", tenant=tenant).read()
        assert [e.type for e in events].count("order.placed") == 1
        assert len(events) == 11


async def test_conflict_racing_with_original(y, tenant):
    s = y.stream("/race2", tenant=tenant)
    outcomes = await asyncio.gather(
        *(s.append({"type": "t", "payload": i % 2, "idempotency_key": "k"}) for i in range(10)),
        return_exceptions=True,
    )
    ok = [o for o in outcomes if isinstance(o, yoke.AppendResult)]
    conflicts = [o for o in outcomes if isinstance(o, errors.IdempotencyConflict)]
    assert len(ok) + len(conflicts) == 10 and len(ok) == 5 and len(set(ok)) == 1
    assert len(await s.read()) == 1


@pytest.mark.parametrize("key", ["object:obj_0123456789abcdef01234567", "yoke:copy:abc", "yoke:schedule:x"])
async def test_kernel_key_prefixes_are_reserved(y, tenant, key):
    """A user key with a kernel prefix could squat on an object record or a
    copy: refused, whole batch, nothing appended."""
    s = y.stream("/reserved", tenant=tenant)
    with pytest.raises(errors.ReservedIdempotencyKey) as exc:
        await s.append_many([{"type": "ok"}, {"type": "x", "idempotency_key": key}])
    assert (exc.value.code, exc.value.http_status) == ("reserved_idempotency_key", 400)
    assert exc.value.details["field"] == "idempotency_key"
    assert await s.read() == []
    # A prefix further in is an ordinary key.
    assert (await s.append({"type": "x", "idempotency_key": "my-" + key})).offset == 1
