"""A tenant at a glance: the figures an operator watches (``GET /v1/overview``).

Every figure comes from durable rows except open tails, which are the live
tails this process serves. Appends per second are the difference of two
readings of ``offsets`` (the sum of the streams' heads) over their times.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .clock import SYSTEM, Clock, wall_ms
from .events import validate_tenant
from .store.actors import FanoutLag, QueueDepth
from .store.contract import Store, StreamTotals
from .store.subscriptions import SubscriptionRow, SubscriptionTotals

TOP = 10  # how many of each kind of trouble are named


@dataclass(frozen=True)
class Overview:
    at: int  # ms since the epoch, when the figures were read
    streams: StreamTotals
    open_tails: int
    queue: QueueDepth
    dead_by_instance: list[tuple[str, int]]
    fanout: list[FanoutLag]  # the streams that fan-out most lags behind
    fanout_lag: int  # events not yet fanned out, summed over the streams
    subscriptions: SubscriptionTotals
    attention: list[SubscriptionRow] = field(default_factory=list)  # halted first, then by lag

    def to_dict(self) -> dict[str, Any]:
        return {
            "at": self.at,
            "streams": self.streams.streams,
            "offsets": self.streams.offsets,
            "open_tails": self.open_tails,
            "queue": {"pending": self.queue.pending, "processing": self.queue.processing, "dead": self.queue.dead},
            "dead_letters": [{"instance_id": i, "dead": n} for i, n in self.dead_by_instance],
            "fanout": {
                "lag": self.fanout_lag,
                "streams": [{"path": f.path, "head": f.head, "through": f.through, "lag": f.head - f.through}
                            for f in self.fanout],
            },
            "subscriptions": {
                "count": self.subscriptions.subscriptions,
                "halted": self.subscriptions.halted,
                "lag": self.subscriptions.lag,
                "attention": [
                    {"path": r.path, "name": r.name, "halted": r.halted is not None,
                     "lag": max(r.head - r.cursor, 0), "last_error": r.last_error}
                    for r in self.attention
                ],
            },
        }


async def overview(
    store: Store, tenant: str, open_tails: int = 0, top: int = TOP, clock: Clock = SYSTEM
) -> Overview:
    validate_tenant(tenant)
    at = wall_ms(clock)  # the runtime's clock: when the figures were taken
    totals = await store.stream_totals(tenant)
    queue = await store.actors.queue_depth(tenant, None)
    dead = await store.actors.dead_by_instance(tenant, top) if queue.dead else []
    lagging = await store.actors.fanout_lag(tenant)
    subscriptions, attention = await store.subscriptions.totals(tenant, top)
    worst = sorted(lagging, key=lambda f: f.through - f.head)[:top]
    return Overview(
        at=at, streams=totals, open_tails=open_tails, queue=queue, dead_by_instance=dead, fanout=worst,
        fanout_lag=sum(f.head - f.through for f in lagging), subscriptions=subscriptions,
        attention=[r for r in attention if r.halted is not None or r.head > r.cursor],
    )
