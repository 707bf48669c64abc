"""A subscription's last error and when it happened (``last_error``,
``last_error_at``) on both drivers: a failed attempt stamps the time by the
store's clock, a later successful delivery keeps both (so a running
subscription still says "it last failed at T"), and every write of the row
(a control decision, a catalogue rebuild) carries the time over."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from yoke.config import Settings
from yoke.store import Store, connect_store
from yoke.store.subscriptions import Change
from yoke.subscriptions.catalogue import merge_rebuilt
from yoke.subscriptions.management import SubscriptionStatus

from .conftest import append, new_id
from .test_subscriptions_outbox import configured

T0 = 1_800_000_000_000  # ms: the clock the store is given, not the machine's


class Clock:
    """A clock the test moves."""

    def __init__(self, ms: int) -> None:
        self.ms = ms

    def wall(self) -> float:
        return self.ms / 1000

    def monotonic(self) -> float:
        return self.ms / 1000


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture
async def timed_store(store_url: str, clock: Clock) -> AsyncIterator[Store]:
    s = connect_store(Settings(database_url=store_url), clock)
    await s.start(on_wakeup=lambda tenant, path: None, on_resync=lambda: None)
    try:
        yield s
    finally:
        await s.close()


async def test_an_error_is_stamped_and_kept_after_a_delivery(timed_store, clock, tenant):
    store = timed_store
    await append(store, tenant, "/src", 3)
    row = await configured(store, tenant, "/src", "s")
    assert (row.last_error, row.last_error_at) == (None, None)

    failed = await store.subscriptions.fail(tenant, "/src", "s", row.generation, 1, "down", T0 + 5000)
    assert (failed.last_error, failed.last_error_at) == ("down", T0)
    assert failed.attempt_errors[-1]["at"] == T0  # the same time as the attempt kept

    clock.ms = T0 + 60_000  # a minute later the receiver takes the events
    acked = await store.subscriptions.ack(tenant, "/src", "s", row.generation, 3, 3, clock.ms)
    assert (acked.cursor, acked.attempts, acked.attempt_errors) == (3, 0, ())
    assert (acked.last_error, acked.last_error_at) == ("down", T0)
    got = await store.subscriptions.get(tenant, "/src", "s")
    assert (got.last_error, got.last_error_at) == ("down", T0)
    assert [(r.last_error, r.last_error_at) for r in await store.subscriptions.list(tenant, "/src")] == [("down", T0)]
    assert [r.last_error_at for r in await store.subscriptions.leases(tenant, ["/src"])] == [T0]
    _, attention = await store.subscriptions.totals(tenant, 10)
    assert [r.last_error_at for r in attention] == [T0]
    status = SubscriptionStatus.of(got, clock.ms)
    assert (status.state, status.last_error, status.last_error_at) == ("running", "down", T0)
    assert status.to_dict()["last_error_at"] == T0

    # The next failure moves it.
    await append(store, tenant, "/src", 1)
    again = await store.subscriptions.fail(tenant, "/src", "s", row.generation, 1, "down again", T0 + 70_000)
    assert (again.last_error, again.last_error_at) == ("down again", T0 + 60_000)


async def test_row_writes_carry_the_error_time(timed_store, clock, tenant):
    store = timed_store
    await append(store, tenant, "/src", 2)
    row = await configured(store, tenant, "/src", "s")
    await store.subscriptions.fail(tenant, "/src", "s", row.generation, 1, "down", T0 + 5000)

    # A control decision writes the whole row: the time it decides goes in.
    def halt(current, source):
        new = replace(current, halted={"offset": 3, "error": "halted"}, last_error="halted",
                      last_error_at=source.now)
        return Change(row=new, bookkeeping=True, reply=new)

    await store.subscriptions.control(tenant, "/src", "s", halt, T0 + 1000, new_id())
    got = await store.subscriptions.get(tenant, "/src", "s")
    assert (got.last_error, got.last_error_at) == ("halted", T0 + 1000)

    # A catalogue rebuild keeps it while the generation stands (as last_error).
    rebuilt = replace(got, last_error=None, last_error_at=None, attempts=0)
    info = await store.info(tenant, "/src")
    assert await store.subscriptions.write_catalogue(
        tenant, "/src", info.head, lambda current: merge_rebuilt({"s": rebuilt}, current), now=clock.ms,
    )
    got = await store.subscriptions.get(tenant, "/src", "s")
    assert (got.last_error, got.last_error_at) == ("halted", T0 + 1000)
