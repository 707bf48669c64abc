"""A repaired live gap leaves evidence (workflow streams' gap evidence): events a tail finds on
its periodic reread, with no wake-up for them, give a metric, a log line
and a record operators can fetch. The lost notification is real: the
events are committed straight through the store, which wakes nobody in
this process (on PostgreSQL its own NOTIFY is skipped as this process's)."""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import REGISTRY

import yoke
from yoke.events import prepare
from tests.conftest import now_ms
from yoke.streams.append import new_stream_id


def repaired(cause: str) -> float:
    return REGISTRY.get_sample_value("yoke_tail_gaps_repaired_total", {"cause": cause}) or 0.0


async def test_a_gap_repaired_by_the_sweep_leaves_evidence(db_url, tenant, caplog):
    caplog.set_level(logging.WARNING, logger="yoke.streams.gaps")
    async with yoke.open(db_url, tail_sweep_s=0.2) as y:
        stream = y.stream("/gappy", tenant)
        await stream.append({"type": "first"})
        tail = stream.tail(after=0)
        assert (await anext(tail)).offset == 1
        await stream.append({"type": "announced"})  # woken: no gap
        assert (await anext(tail)).offset == 2
        before = repaired("sweep")
        lost = [prepare({"type": "unannounced", "payload": i}) for i in range(3)]
        await y.store.commit(tenant, "/gappy", lost, [0, 0, 0], now_ms() - 5000, new_stream_id())
        got = [await asyncio.wait_for(anext(tail), 30) for _ in range(3)]
        await tail.aclose()
        assert [e.offset for e in got] == [3, 4, 5]
        assert y.gaps.repaired == 1 and repaired("sweep") == before + 1
        assert any("live gap repaired" in r.getMessage() and "offsets 3-5" in r.getMessage() for r in caplog.records)
        deadline = asyncio.get_running_loop().time() + 30
        while not (evidence := await stream.gaps()) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        [gap] = evidence
        assert (gap.first, gap.last, gap.cause) == (3, 5, "sweep") and gap.detected_at > 0 and gap.process
        # A second tail finding the same gap records nothing more.
        assert [e.offset async for e in _take(stream.tail(after=2), 3)] == [3, 4, 5]
        assert y.gaps.repaired == 1


async def _take(tail, n: int):
    count = 0
    async for event in tail:
        yield event
        count += 1
        if count == n:
            await tail.aclose()
            return
