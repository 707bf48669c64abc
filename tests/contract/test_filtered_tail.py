"""Filtered tails (as session connections use them), on both backends."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import Filter, InvalidFilter


async def test_a_filtered_tail_replays_then_follows_only_matches(y: yoke.Runtime, tenant: str) -> None:
    s = y.stream("/chat", tenant)
    await s.append_many([
        {"type": "msg", "payload": {"visible": True, "n": 1}},
        {"type": "msg", "payload": {"visible": False, "n": 2}},
        {"type": "other", "payload": {"visible": True, "n": 3}},
    ])
    tail = s.tail(after=0, filter=Filter(types=["msg"], where="payload.visible = true"))
    got = [await asyncio.wait_for(tail.__anext__(), 10)]
    await s.append({"type": "msg", "payload": {"visible": True, "n": 4}, "ephemeral": True})
    await s.append({"type": "msg", "payload": {"visible": True, "n": 5}})
    got += [await asyncio.wait_for(tail.__anext__(), 10) for _ in range(2)]
    await tail.aclose()
    assert [(e.payload["n"], e.ephemeral) for e in got] == [(1, False), (4, True), (5, False)]


async def test_ephemeral_events_can_be_left_out(y: yoke.Runtime, tenant: str) -> None:
    s = y.stream("/chat", tenant)
    await s.append({"type": "msg", "payload": {"n": 1}, "ephemeral": True})
    await s.append({"type": "msg", "payload": {"n": 2}})
    tail = s.tail(after=0, include_ephemeral=False, filter={"types": ["msg"]})
    first = await asyncio.wait_for(tail.__anext__(), 10)
    await tail.aclose()
    assert first.payload == {"n": 2}


async def test_a_filter_that_fails_ends_the_tail_with_its_error(y: yoke.Runtime, tenant: str) -> None:
    s = y.stream("/chat", tenant)
    await s.append({"type": "msg", "payload": {"v": "text"}})
    tail = s.tail(after=0, filter=Filter(types=["*"], where="$number(payload.v) > 1"))
    with pytest.raises(InvalidFilter) as info:
        await asyncio.wait_for(tail.__anext__(), 10)
    assert info.value.code == "filter_failed"


async def test_bad_filters_are_refused_up_front(y: yoke.Runtime, tenant: str) -> None:
    s = y.stream("/chat", tenant)
    with pytest.raises(InvalidFilter):
        s.tail(after=0, filter={"types": ["msg"], "where": "payload.("})
    with pytest.raises(InvalidFilter):
        s.tail(after=0, filter={"types": ["msg"], "key": "payload.id"})
