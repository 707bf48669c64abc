"""The subscription store (control, leases, acknowledgements) and the input
outbox on both drivers."""

from __future__ import annotations

from yoke.events import prepare
from tests.conftest import now_ms
from yoke.store.subscriptions import Change, DeliveryOwner, SubscriptionRow

from .conftest import append, ev, new_id


def configure(tenant: str, path: str, name: str):
    """A decision that configures ``name`` with its cursor at 0 (one event)."""

    def decide(current, source):
        event = prepare({"type": "sub.configured", "payload": {"name": name}})
        row = SubscriptionRow(
            tenant, path, name, {"receiver": "r"}, source.next_offset, event.id, now_ms(),
            source.next_offset, source.stream_id, 0,
        )
        return Change(events=[event], row=row, reply=current)

    return decide


async def configured(store, tenant, path, name) -> SubscriptionRow:
    change, outcomes = await store.subscriptions.control(tenant, path, name, configure(tenant, path, name), now_ms(), new_id())
    assert [o.status for o in outcomes] == ["ok"] and change.reply is None
    return await store.subscriptions.get(tenant, path, name)


async def test_control_appends_and_writes_the_row_together(store, tenant):
    await append(store, tenant, "/src", 2)
    row = await configured(store, tenant, "/src", "copy")
    assert (row.configured_at, row.generation, row.cursor) == (3, 3, 0)
    assert row.source_stream_id == (await store.info(tenant, "/src")).stream_id
    assert [e.type for e in (await store.read(tenant, "/src", 2, 10)).events] == ["sub.configured"]
    assert [r.name for r in await store.subscriptions.list(tenant, "/src")] == ["copy"]
    totals, rows = await store.subscriptions.totals(tenant, 10)
    assert totals.subscriptions == 1 and [r.name for r in rows] == ["copy"]
    assert tenant in await store.subscriptions.tenants()


async def test_a_refused_append_writes_no_row(store, tenant):
    await append(store, tenant, "/closed", 1)
    await store.update_stream(tenant, "/closed", closed=True)
    _, outcomes = await store.subscriptions.control(
        tenant, "/closed", "s", configure(tenant, "/closed", "s"), now_ms(), new_id()
    )
    assert [o.status for o in outcomes] == ["closed"]
    assert await store.subscriptions.get(tenant, "/closed", "s") is None


async def test_ack_advances_within_its_generation_and_fail_counts(store, tenant):
    await append(store, tenant, "/src", 3)
    row = await configured(store, tenant, "/src", "s")
    acked = await store.subscriptions.ack(tenant, "/src", "s", row.generation, 2, 2, now_ms())
    assert (acked.cursor, acked.delivered) == (2, 2)
    # never back; a late acknowledgement of another generation changes nothing
    assert (await store.subscriptions.ack(tenant, "/src", "s", row.generation, 1, 1, now_ms())).cursor == 2
    assert await store.subscriptions.ack(tenant, "/src", "s", row.generation - 1, 3, 1, now_ms()) is None
    assert await store.subscriptions.ack(tenant, "/src", "s", row.generation, 3, 1, now_ms(), stream_id="other") is None
    failed = await store.subscriptions.fail(tenant, "/src", "s", row.generation, 1, "down", now_ms() + 5000)
    assert (failed.attempts, failed.last_error, failed.cursor) == (1, "down", 2)
    cleared = await store.subscriptions.ack(tenant, "/src", "s", row.generation, 3, 1, now_ms())
    assert (cleared.cursor, cleared.attempts) == (3, 0)


async def test_leases_go_to_live_owners(store, tenant):
    await append(store, tenant, "/src", 1)
    await configured(store, tenant, "/src", "s")
    first, second = new_id("o"), new_id("o")
    await store.subscriptions.register_owner(DeliveryOwner(first, "v1"), 60_000)
    await store.subscriptions.register_owner(DeliveryOwner(second, "v1"), 60_000)
    assert {first, second} <= {o.owner for o in await store.subscriptions.owners()}
    assert [r.lease_owner for r in await store.subscriptions.take(tenant, first, [("/src", "s")])] == [first]
    assert await store.subscriptions.take(tenant, second, [("/src", "s")]) == []  # held
    (lease,) = await store.subscriptions.leases(tenant, ["/src"])
    assert lease.lease_owner == first and lease.head == 2
    await store.subscriptions.give(tenant, first, [("/src", "s")])
    assert [r.lease_owner for r in await store.subscriptions.take(tenant, second, [("/src", "s")])] == [second]
    assert await store.subscriptions.beat_owner(second)
    await store.subscriptions.drop_owner(second)
    assert not await store.subscriptions.beat_owner(second)
    # its holder gone, the subscription is free
    assert [r.lease_owner for r in await store.subscriptions.take(tenant, first, [("/src", "s")])] == [first]
    await store.subscriptions.drop_owner(first)


async def test_outbox_rows_until_done(store, tenant):
    result = await store.outbox.append_input(tenant, "/in", [ev(idempotency_key="r1")], now_ms(), new_id(), "/wake")
    assert [o.status for o in result.outcomes] == ["ok"]
    again = await store.outbox.append_input(tenant, "/in", [ev(idempotency_key="r1")], now_ms(), new_id(), "/wake")
    assert [o.status for o in again.outcomes] == ["duplicate"]
    mine = [d for d in await store.outbox.due(now_ms(), 100) if d.tenant == tenant]
    assert [(d.path, d.offset, d.wake_path, d.attempts) for d in mine] == [("/in", 1, "/wake", 0)]
    assert mine[0].lifetime_id == (await store.info(tenant, "/in")).stream_id
    later = now_ms() + 60_000
    await store.outbox.retry(tenant, "/in", 1, later, "no route")
    assert [d for d in await store.outbox.due(now_ms(), 100) if d.tenant == tenant] == []
    (retried,) = [d for d in await store.outbox.due(later, 100) if d.tenant == tenant]
    assert retried.attempts == 1
    await store.outbox.done(tenant, "/in", 1)
    assert [d for d in await store.outbox.due(later, 100) if d.tenant == tenant] == []
