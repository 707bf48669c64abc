"""Expensive JSONata (a regex, a function) in every caller of filter
evaluation: tails, subscriptions' filters and transforms, actors' routes and
keys. They run in evaluator processes (routing/evaluation.py) and answer as
light expressions do; on both backends."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import App, Filter, InvalidFilter
from yoke.routing.cost import expensive

from ..subscriptions.common import FAST

EVENTS = [
    {"type": "msg", "payload": {"s": "abbbc", "n": 1}},
    {"type": "msg", "payload": {"s": "ac", "n": 2}},
    {"type": "other", "payload": {"s": "abc", "n": 3}},
    {"type": "msg", "payload": {"s": "abc", "n": 4}},
]
WHERE = "$contains(payload.s, /^ab+c$/)"
TRANSFORM = '{"payload": {"n": payload.n, "bs": $count($filter($split(payload.s, ""), function($c){$c = "b"}))}}'


def test_the_expressions_here_are_expensive() -> None:
    assert expensive(WHERE) and expensive(TRANSFORM)


async def test_a_tail_with_an_expensive_filter_replays_then_follows_only_matches(
    y: yoke.Runtime, tenant: str
) -> None:
    s = y.stream("/chat", tenant)
    await s.append_many(EVENTS)
    tail = s.tail(after=0, filter=Filter(types=["msg"], where=WHERE))
    got = [await asyncio.wait_for(tail.__anext__(), 10) for _ in range(2)]
    await s.append({"type": "msg", "payload": {"s": "abbc", "n": 5}})
    got.append(await asyncio.wait_for(tail.__anext__(), 10))
    await tail.aclose()
    assert [e.payload["n"] for e in got] == [1, 4, 5]
    assert y.evaluations.pool.started >= 1


async def test_an_expensive_filter_that_fails_ends_the_tail_with_its_error(y: yoke.Runtime, tenant: str) -> None:
    s = y.stream("/chat", tenant)
    await s.append({"type": "msg", "payload": {"s": "abc"}})
    tail = s.tail(after=0, filter=Filter(where=WHERE))
    assert (await asyncio.wait_for(tail.__anext__(), 10)).payload == {"s": "abc"}
    await s.append({"type": "msg", "payload": {"s": 5}})
    with pytest.raises(InvalidFilter) as info:
        await asyncio.wait_for(tail.__anext__(), 10)
    assert info.value.code == "filter_failed" and "does not match" in info.value.message  # $contains(5, ...)


async def test_a_copy_with_an_expensive_filter_and_transform(db_url: str) -> None:
    async with yoke.open(db_url, **FAST) as y:
        tenant = "copy-expensive"
        source, target = y.stream("/src", tenant), y.stream("/dst", tenant)
        await source.append_many(EVENTS)
        await source.subscribe("c", yoke.copy_to_stream("/dst"),
                               filter={"types": ["msg"], "where": WHERE}, transform=TRANSFORM, start="beginning")
        await source.wait_until_processed("c", (await source.info()).head, timeout_s=20)
        copied = [e.payload for e in await target.read() if e.type == "msg"]
    assert copied == [{"n": 1, "bs": 3}, {"n": 4, "bs": 1}]


async def test_fan_out_routes_by_expensive_filters_and_keys(fresh_url: str, tmp_path) -> None:
    app = App()
    seen: list[tuple[str, str, int]] = []

    @app.actor("by-bs", filter=Filter(types=["msg"], key="$match(payload.s, /b+/).match"))
    async def by_bs(ctx, event):  # noqa: ANN001
        seen.append(("by-bs", ctx.instance.key, event.payload["n"]))

    @app.actor("rec")
    async def rec(ctx, event):  # noqa: ANN001
        seen.append(("rec", ctx.instance.key, event.payload["n"]))

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.instances("acme").create("rec", key="regex", filter={"types": ["msg"], "where": WHERE})
        await y.stream("/chat", "acme").append_many(EVENTS)
        await y.wait_idle(timeout_s=20)
    assert sorted(seen) == [("by-bs", "b", 4), ("by-bs", "bbb", 1), ("rec", "regex", 1), ("rec", "regex", 4)]
