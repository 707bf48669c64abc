"""Consumers on both drivers: acks only advance, under the stream's row
lock, and keep the unread counters (producer credit) exact."""

from __future__ import annotations

import pytest

from yoke import errors
from tests.conftest import now_ms
from yoke.store.results import Limits

from .conftest import append


async def test_ack_creates_and_advances_a_consumer(store, tenant):
    await append(store, tenant, "/c", 5)
    created = await store.ack(tenant, "/c", "reader", 2, 1000)
    assert (created.consumer_id, created.acked, created.created_at, created.updated_at) == ("reader", 2, 1000, 1000)
    moved = await store.ack(tenant, "/c", "reader", 4, 2000)
    assert (moved.acked, moved.created_at, moved.updated_at) == (4, 1000, 2000)
    same = await store.ack(tenant, "/c", "reader", 4, 3000)
    assert same.acked == 4
    await store.ack(tenant, "/c", "other", 1, 1000)
    assert [(c.consumer_id, c.acked) for c in await store.consumers(tenant, "/c")] == [("other", 1), ("reader", 4)]


async def test_ack_refusals(store, tenant):
    await append(store, tenant, "/c", 3)
    await store.ack(tenant, "/c", "r", 2, now_ms())
    with pytest.raises(errors.AckRegression):
        await store.ack(tenant, "/c", "r", 1, now_ms())
    with pytest.raises(errors.InvalidAck):
        await store.ack(tenant, "/c", "r", 4, now_ms())
    with pytest.raises(errors.StreamNotFound):
        await store.ack(tenant, "/missing", "r", 0, now_ms())
    assert (await store.consumers(tenant, "/c"))[0].acked == 2


async def test_unread_counts_after_the_slowest_consumer(store, tenant):
    result = await append(store, tenant, "/u", 4)
    assert (await store.info(tenant, "/u")).usage.min_ack is None
    await store.ack(tenant, "/u", "fast", 3, now_ms())
    await store.ack(tenant, "/u", "slow", 1, now_ms())
    usage = (await store.info(tenant, "/u")).usage
    assert (usage.min_ack, usage.unread_events, usage.durable_events) == (1, 3, 4)
    assert usage.unread_bytes == usage.durable_bytes - (usage.durable_bytes // 4)
    assert result.head == 4
    assert await store.delete_consumer(tenant, "/u", "slow")
    assert not await store.delete_consumer(tenant, "/u", "slow")
    usage = (await store.info(tenant, "/u")).usage
    assert (usage.min_ack, usage.unread_events) == (3, 1)


async def test_unread_ceiling_refuses_until_a_consumer_acks(store, tenant):
    await append(store, tenant, "/b", 2)
    await store.ack(tenant, "/b", "r", 0, now_ms())
    await store.update_stream(tenant, "/b", limits=Limits(max_unread_events=3))
    assert [o.status for o in (await append(store, tenant, "/b", 2)).outcomes] == ["unread_full"] * 2
    assert [o.status for o in (await append(store, tenant, "/b", 1)).outcomes] == ["ok"]
    await store.ack(tenant, "/b", "r", 3, now_ms())
    assert [o.status for o in (await append(store, tenant, "/b", 3)).outcomes] == ["ok"] * 3
