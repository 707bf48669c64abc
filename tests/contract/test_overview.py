"""The tenant overview's store reads on both backends: stream totals, the
subscriptions counted with their lag and the ones that need a look, dead
rows by instance; each tenant sees its own only."""

from __future__ import annotations

from yoke.overview import overview
from yoke.subscriptions.receivers import from_dict


async def test_totals_of_streams_and_subscriptions(y, tenant):
    empty = await overview(y.store, tenant)
    assert (empty.streams.streams, empty.streams.offsets, empty.subscriptions.subscriptions) == (0, 0, 0)
    assert empty.attention == [] and empty.fanout_lag == 0
    a, b = y.stream("/a", tenant=tenant), y.stream("/b", tenant=tenant)
    await a.append_many([{"type": "x"}] * 3)
    await b.append({"type": "y"})
    # A call no process delivers: it lags by everything after its configure event.
    await a.subscribe("calls", from_dict({"kind": "call", "function": "nobody"}), start="beginning")
    await a.append({"type": "z"})
    seen = await overview(y.store, tenant)
    listed = await y.streams(tenant)
    assert {"/a", "/b"} <= {s.path for s in listed}  # and '/' where the runtime records facts
    assert (seen.streams.streams, seen.streams.offsets) == (len(listed), sum(s.head for s in listed))
    assert {s.path: s.head for s in listed}["/a"] == 5  # 3, the configure event, 1
    assert (seen.subscriptions.subscriptions, seen.subscriptions.halted, seen.subscriptions.lag) == (1, 0, 5)
    [row] = seen.attention
    assert (row.path, row.name) == ("/a", "calls")
    assert seen.queue.dead == 0 and seen.dead_by_instance == []
    assert (await y.store.actors.dead_by_instance(tenant, 10)) == []
    other = await overview(y.store, tenant + "x")
    assert (other.subscriptions.subscriptions, other.attention) == (0, [])
    assert {s.path for s in await y.streams(tenant + "x")} & {"/a", "/b"} == set()
    assert other.to_dict()["subscriptions"] == {"count": 0, "halted": 0, "lag": 0, "attention": []}
