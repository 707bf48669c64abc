"""Group commit under concurrency: exact offsets, exact tails, isolated failures."""

from __future__ import annotations

import asyncio

import pytest

import yoke
from yoke import errors

PRODUCERS = 50
PER_PRODUCER = 200
TOTAL = PRODUCERS * PER_PRODUCER


async def _collect(stream: yoke.Stream, count: int, ready: asyncio.Event) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    tail = stream.tail(after=0)
    ready.set()
    async for event in tail:
        seen.append((event.offset, event.payload["k"]))
        if len(seen) == count:
            break
    await tail.aclose()
    return seen


async def test_fifty_producers_and_three_tails(y, tenant):
    s = y.stream("/busy", tenant=tenant)
    readies = [asyncio.Event() for _ in range(3)]
    tails = [asyncio.create_task(_collect(s, TOTAL, r)) for r in readies]
    await asyncio.gather(*(r.wait() for r in readies))

    async def produce(p: int) -> list[int]:
        return [
            (await s.append({"type": "tick", "payload": {"k": f"{p}:{i}"}})).offset
            for i in range(PER_PRODUCER)
        ]

    offsets = [o for batch in await asyncio.gather(*(produce(p) for p in range(PRODUCERS))) for o in batch]
    assert sorted(offsets) == list(range(1, TOTAL + 1))

    stored = []
    after = 0
    while page := await s.read(after=after, limit=5000):
        stored += [(e.offset, e.payload["k"]) for e in page]
        after = page[-1].offset
    assert [o for o, _ in stored] == list(range(1, TOTAL + 1))
    # Each producer's own events are in its append order.
    for p in range(PRODUCERS):
        mine = [k for _, k in stored if k.startswith(f"{p}:")]
        assert mine == [f"{p}:{i}" for i in range(PER_PRODUCER)]

    for seen in await asyncio.wait_for(asyncio.gather(*tails), timeout=60):
        assert seen == stored


async def test_concurrent_batches_stay_contiguous_and_atomic(y, tenant):
    s = y.stream("/batches", tenant=tenant)

    async def batch(n: int):
        return await s.append_many([{"type": "b", "payload": {"n": n, "i": i}} for i in range(10)])

    results = await asyncio.gather(*(batch(n) for n in range(40)))
    for rs in results:
        offsets = [r.offset for r in rs]
        assert offsets == list(range(offsets[0], offsets[0] + 10))
    assert sorted(r.offset for rs in results for r in rs) == list(range(1, 401))


async def test_a_failing_call_does_not_fail_its_group_neighbours(y, tenant):
    s = y.stream("/mixed", tenant=tenant)
    await s.append({"type": "keyed", "payload": 1, "idempotency_key": "taken"})

    async def good(i: int):
        return await s.append({"type": "good", "payload": i})

    async def conflicting():
        return await s.append_many(
            [{"type": "new"}, {"type": "keyed", "payload": 2, "idempotency_key": "taken"}]
        )

    outcomes = await asyncio.gather(
        *(good(i) for i in range(20)), conflicting(), *(good(i) for i in range(20, 40)),
        return_exceptions=True,
    )
    assert isinstance(outcomes[20], errors.IdempotencyConflict)
    good_offsets = sorted(o.offset for o in outcomes if isinstance(o, yoke.AppendResult))
    assert good_offsets == list(range(2, 42))
    assert [e.type for e in await s.read()].count("new") == 0


async def test_cancelled_caller_does_not_break_the_group(y, tenant):
    s = y.stream("/cancel", tenant=tenant)
    tasks = [asyncio.create_task(s.append({"type": "x", "payload": i})) for i in range(20)]
    tasks[5].cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(done[5], asyncio.CancelledError)
    # The cancelled call may or may not have been committed; the others were.
    committed = [e.payload for e in await s.read()]
    assert set(range(20)) - {5} <= set(committed)
    assert len(committed) == len(set(committed))


@pytest.mark.parametrize("runtimes", [2])
async def test_two_runtimes_on_one_database_never_share_an_offset(db_url, tenant, runtimes):
    async with yoke.open(db_url) as a, yoke.open(db_url) as b:
        sa, sb = a.stream("/shared", tenant=tenant), b.stream("/shared", tenant=tenant)

        async def produce(s, n):
            return [(await s.append({"type": "x"})).offset for _ in range(n)]

        got = await asyncio.gather(*(produce(sa if i % 2 else sb, 50) for i in range(10)))
        assert sorted(o for g in got for o in g) == list(range(1, 501))
