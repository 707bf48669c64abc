"""Retention: pruning by count and age, legal hold, and 410 for pruned cursors."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors


async def test_prune_by_count_and_cursor_gone(y, tenant):
    s = y.stream("/r", tenant=tenant)
    await s.append_many([{"type": "e", "payload": i} for i in range(10)])
    await s.set_retention(max_events=4)
    assert await y.prune() >= 6
    info = await s.info()
    assert info.earliest == 7 and info.head == 10
    with pytest.raises(errors.CursorGone) as exc:
        await s.read(after=5)
    assert (exc.value.code, exc.value.http_status) == ("cursor_gone", 410)
    assert exc.value.details == {"requested": 5, "earliest": 7, "latest": 10, "reason": "retention"}
    with pytest.raises(errors.CursorGone):
        await s.read(after=0)
    with pytest.raises(errors.CursorGone):
        await s.get(3)
    # Cursor exactly at pruned_through still works: its next event exists.
    assert [e.offset for e in await s.read(after=6)] == [7, 8, 9, 10]
    # A second pass has nothing left to do.
    await y.prune()
    assert len(await s.read(after=6)) == 4


async def test_prune_by_age(y, tenant):
    # The pass takes "now" from its caller, so the test moves the clock
    # instead of sleeping.
    s = y.stream("/age", tenant=tenant)
    await s.append_many([{"type": "old"}] * 3)
    at = (await s.read())[-1].at
    await s.set_retention(max_age_s=5)
    await y.store.prune(at + 4_000)
    assert len(await s.read()) == 3
    await y.store.prune(at + 6_000)
    assert await s.read(after=3) == []
    assert (await s.info()).earliest == 4
    with pytest.raises(errors.CursorGone):
        await s.read(after=0)
    assert (await s.append({"type": "new"})).offset == 4
    assert [e.type for e in await s.read(after=3)] == ["new"]


async def test_legal_hold_prevents_pruning(y, tenant):
    s = y.stream("/held", tenant=tenant)
    await s.append_many([{"type": "e"}] * 10)
    await s.set_retention(max_events=2)
    assert (await s.set_legal_hold(True)).legal_hold
    await y.prune()
    assert len(await s.read()) == 10
    await s.set_legal_hold(False)
    await y.prune()
    assert [e.offset for e in await s.read(after=8)] == [9, 10]


async def test_tail_behind_retention_gets_cursor_gone(y, tenant):
    s = y.stream("/slow", tenant=tenant)
    await s.append_many([{"type": "e"}] * 5)
    await s.set_retention(max_events=1)
    await y.prune()
    with pytest.raises(errors.CursorGone):
        async for _ in s.tail(after=0):
            pass


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_age_s": 0}, {"max_age_s": -1}, {"max_events": 0}, {"max_events": 1.5}, {"max_age_s": "1"},
        {"max_age_s": float("inf")}, {"max_age_s": float("nan")}, {"max_age_s": 1e300}, {"max_events": 2**64},
    ],
)
async def test_invalid_retention(y, tenant, kwargs):
    s = y.stream("/bad", tenant=tenant)
    await s.append({"type": "x"})
    with pytest.raises(errors.InvalidInput):
        await s.set_retention(**kwargs)


async def test_settings_on_missing_stream(y, tenant):
    with pytest.raises(errors.StreamNotFound):
        await y.stream("/ghost", tenant=tenant).set_legal_hold(True)
    with pytest.raises(errors.StreamNotFound):
        await y.stream("/ghost", tenant=tenant).set_retention(max_events=3)


async def test_runtime_prunes_periodically(db_url, tenant):
    async with yoke.open(db_url, prune_interval_s=0.05) as y:
        s = y.stream("/auto", tenant=tenant)
        await s.append_many([{"type": "e"}] * 5)
        await s.set_retention(max_events=2)
        # The background pass runs on its own; wait for its effect.
        async with asyncio.timeout(20):
            while (await s.info()).earliest != 4:
                await asyncio.sleep(0.02)
        assert [e.offset for e in await s.read(after=3)] == [4, 5]
