"""Consumers, acknowledgements and durable producer credit."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors
from yoke.store.contract import Limits


async def test_acks_only_advance(y, tenant):
    s = y.stream("/acks", tenant=tenant)
    await s.append_many([{"type": "e"}] * 5)
    info = await s.ack("worker", 2)
    assert (info.consumer_id, info.acked) == ("worker", 2)
    assert (await s.ack("worker", 2)).acked == 2  # repeating is fine
    with pytest.raises(errors.AckRegression) as exc:
        await s.ack("worker", 1)
    assert (exc.value.code, exc.value.http_status) == ("ack_regression", 409)
    with pytest.raises(errors.InvalidAck) as exc:
        await s.ack("worker", 6)
    assert (exc.value.code, exc.value.http_status) == ("invalid_ack", 400)
    await s.ack("worker", 5)
    await s.ack("audit", 0)
    assert [(c.consumer_id, c.acked) for c in await s.consumers()] == [("audit", 0), ("worker", 5)]
    assert (await s.info()).usage.min_ack == 0
    assert await s.remove_consumer("audit")
    assert (await s.info()).usage.min_ack == 5
    with pytest.raises(errors.StreamNotFound):
        await y.stream("/nope", tenant=tenant).ack("w", 0)
    with pytest.raises(errors.InvalidInput):
        await s.ack("bad consumer!", 1)


async def test_unread_ceiling_rejects_until_acknowledged(y, tenant):
    s = y.stream("/credit", tenant=tenant)
    await s.create(limits=Limits(max_unread_events=3))
    await s.ack("reader", 0)
    await s.append_many([{"type": "e"}] * 3)
    with pytest.raises(errors.Backpressure) as exc:
        await s.append({"type": "e"})
    assert (exc.value.code, exc.value.http_status) == ("backpressure", 429)
    assert exc.value.details["retry_after"] >= 1
    # An atomic batch that does not fit is refused whole.
    await s.ack("reader", 1)
    with pytest.raises(errors.Backpressure):
        await s.append_many([{"type": "e"}] * 2)
    assert (await s.append({"type": "e"})).offset == 4
    usage = (await s.info()).usage
    assert (usage.unread_events, usage.durable_events, usage.min_ack) == (3, 4, 1)
    # Ephemeral events and idempotent duplicates take no credit.
    await s.append({"type": "e", "ephemeral": True})
    await s.ack("reader", 4)
    first = await s.append({"type": "k", "idempotency_key": "k1"})
    await s.append_many([{"type": "e"}] * 2)
    assert await s.append({"type": "k", "idempotency_key": "k1"}) == first


async def test_unread_bytes_and_total_ceilings(y, tenant):
    s = y.stream("/bytes", tenant=tenant)
    await s.create(limits=Limits(max_unread_bytes=1000, max_total_events=6))
    await s.ack("r", 0)
    await s.append({"type": "e", "payload": "x" * 700})
    with pytest.raises(errors.Backpressure):
        await s.append({"type": "e", "payload": "x" * 700})
    await s.ack("r", 1)
    await s.append_many([{"type": "e"}] * 5)
    with pytest.raises(errors.QuotaExhausted) as exc:
        await s.append({"type": "e"})
    assert (exc.value.code, exc.value.http_status) == ("quota_exhausted", 507)
    assert (await s.info()).head == 6
    # Retention frees total credit.
    await s.set_retention(max_events=2)
    await y.prune()
    usage = (await s.info()).usage
    assert usage.durable_events == 2
    await s.ack("r", 6)
    assert (await s.append({"type": "e"})).offset == 7


async def test_no_consumer_means_no_unread_ceiling(y, tenant):
    s = y.stream("/free", tenant=tenant)
    await s.create(limits=Limits(max_unread_events=1))
    await s.append_many([{"type": "e"}] * 5)
    assert (await s.info()).usage.unread_events == 0
    # The first consumer starts with everything after its ack unread.
    await s.ack("late", 2)
    assert (await s.info()).usage.unread_events == 3
    with pytest.raises(errors.Backpressure):
        await s.append({"type": "e"})


async def test_block_policy_waits_for_credit(y, tenant):
    s = y.stream("/block", tenant=tenant)
    await s.create(limits=Limits(max_unread_events=2, overflow="block", block_timeout_s=10))
    await s.ack("r", 0)
    await s.append_many([{"type": "e"}] * 2)
    waiting = asyncio.create_task(s.append({"type": "late"}))
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done  # still waiting for credit
    await s.ack("r", 1)
    assert (await asyncio.wait_for(waiting, 10)).offset == 3


async def test_block_policy_times_out(y, tenant):
    s = y.stream("/block2", tenant=tenant)
    await s.create(limits=Limits(max_unread_events=1, overflow="block", block_timeout_s=0.3))
    await s.ack("r", 0)
    await s.append({"type": "e"})
    with pytest.raises(errors.Backpressure):
        await s.append({"type": "e"})


async def test_shared_ceiling_across_runtimes(db_url, tenant):
    async with yoke.open(db_url) as a, yoke.open(db_url) as b:
        sa, sb = a.stream("/shared", tenant=tenant), b.stream("/shared", tenant=tenant)
        await sa.create(limits=Limits(max_unread_events=50))
        await sa.ack("r", 0)

        async def push(s):
            ok = 0
            for _ in range(40):
                try:
                    await s.append({"type": "e"})
                    ok += 1
                except errors.Backpressure:
                    pass
            return ok

        counts = await asyncio.gather(push(sa), push(sb), push(sa), push(sb))
        assert sum(counts) == 50
        assert (await sa.info()).usage.unread_events == 50


@pytest.mark.parametrize(
    "limits",
    [Limits(max_unread_events=0), Limits(max_total_bytes=-1), Limits(overflow="drop"), Limits(block_timeout_s=0)],
)
async def test_invalid_limits(y, tenant, limits):
    with pytest.raises(errors.InvalidInput):
        await y.stream("/l", tenant=tenant).create(limits=limits)


async def test_pinned_definition_never_changes(y, tenant):
    s = y.stream("/def", tenant=tenant)
    info = await s.create(max_events=100, limits=Limits(max_total_events=10), pinned=True, metadata={"owner": "me"})
    assert info.pinned and info.metadata == {"owner": "me"} and info.retention.max_events == 100
    with pytest.raises(errors.StreamPinned) as exc:
        await s.set_retention(max_events=5)
    assert exc.value.http_status == 409
    with pytest.raises(errors.StreamPinned):
        await s.set_limits(Limits())
    assert (await s.set_legal_hold(True)).legal_hold  # a hold is not a definition setting
    assert (await s.close()).closed
    assert (await s.info()).retention.max_events == 100


async def test_closing_the_runtime_releases_blocked_producers(db_url, tenant):
    y = yoke.Runtime(yoke.Settings.from_env(database_url=db_url))
    await y.start()
    s = y.stream("/blocked", tenant=tenant)
    await s.create(limits=Limits(max_unread_events=1, overflow="block", block_timeout_s=60))
    await s.ack("r", 0)
    await s.append({"type": "e"})
    waiting = asyncio.create_task(s.append({"type": "e"}))
    done, _ = await asyncio.wait({waiting}, timeout=0.3)
    assert not done
    started = asyncio.get_running_loop().time()
    await y.close()
    with pytest.raises(errors.RuntimeClosed):
        await asyncio.wait_for(waiting, 10)
    assert asyncio.get_running_loop().time() - started < 5
