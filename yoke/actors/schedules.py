"""Durable schedules: fire ``ctx.schedules`` entries when due.

Any executor may fire any due schedule: ``fire_schedule`` moves the
schedule (to its next cron time, or deletes it) in the same transaction
that enqueues its event, and only if nobody fired it first. A schedule
that targets a stream appends with an idempotency key derived from the
schedule and its due time, so a retry after a crash appends nothing new.
Cron times are computed from now, so a schedule missed while everything
was down fires once on restart.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

from .. import errors
from ..clock import SYSTEM, Clock, wall_ms
from ..events import new_event_id
from ..store.actors import QueueItem, Schedule
from ..store.faults import log_retried
from .ops import next_cron

if TYPE_CHECKING:
    from ..store.actors import ActorStore
    from .kernel import OpenStream

log = logging.getLogger("yoke.actors.schedules")
MAX_ANNOUNCED = 10_000  # due times remembered for an on-time wake-up


class Timers:
    """``store()``: the actor store; ``stream``: opens the stream a schedule
    appends to; ``on_enqueued(tenant)``: a schedule's event was queued."""

    def __init__(
        self, store: Callable[[], ActorStore], stream: OpenStream, *, poll_s: float,
        on_enqueued: Callable[[str], None], clock: Clock = SYSTEM,
    ) -> None:
        self._store = store
        self._stream = stream
        self._clock = clock
        self._poll_s = poll_s
        self._on_enqueued = on_enqueued
        self._wake = asyncio.Event()
        # Due times this process set and has not yet passed (a heap): a
        # schedule due sooner than the next poll fires on time, not a poll
        # later. Bounded: past the bound the polls alone find them.
        self._dues: list[int] = []

    def changed(self, due_ms: int | None = None) -> None:
        self._announce(due_ms)
        self._wake.set()

    def _announce(self, due_ms: int | None) -> None:
        if due_ms is not None and len(self._dues) < MAX_ANNOUNCED:
            heapq.heappush(self._dues, due_ms)

    async def run(self) -> None:
        while True:
            # Woken at the next due time this process knows of (by the clock,
            # so a clock that jumps wakes it too), or by the poll at the latest.
            due_s = self._dues[0] / 1000 if self._dues else None
            try:
                async with self._clock.alarm(due_s, within=self._poll_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            now = self._now_ms()
            while self._dues and self._dues[0] <= now:  # this pass fires them
                heapq.heappop(self._dues)
            try:
                await self.fire_due()
            except asyncio.CancelledError:
                raise
            except Exception:
                log_retried(log, "firing schedules failed")

    async def fire_due(self) -> int:
        fired = 0
        actors = self._store()
        for tenant in await actors.tenants():
            for schedule in await actors.due_schedules(tenant, self._now_ms(), 100):
                try:
                    if await self._fire(schedule):
                        fired += 1
                except asyncio.CancelledError:
                    raise
                except Exception:  # one schedule's trouble must not hold back the others
                    log_retried(log, "schedule %s of %s could not fire; retrying",
                                schedule.name, schedule.instance_id)
        return fired

    def _now_ms(self) -> int:
        return wall_ms(self._clock)

    async def _fire(self, s: Schedule) -> bool:
        now = self._now_ms()
        next_due = next_cron(s.cron, now) if s.cron else None
        event = dict(s.event)
        if s.stream is not None:
            event.setdefault("idempotency_key", f"yoke:schedule:{s.instance_id}:{s.name}:{s.due_at}")
            event.setdefault("source", {"instance": s.instance_id, "schedule": s.name})
            try:
                stream = self._stream(s.stream, s.tenant)
                await stream._append([event], trusted=False, kernel_key=True)
            except (errors.Backpressure, errors.QuotaExhausted, errors.RuntimeClosed, errors.Unavailable):
                raise  # may pass later: fire again on the next poll (the key makes it once)
            except errors.YokeError as exc:
                # Refused for good (a closed stream, an invalid event): this
                # firing is dropped, the schedule moves on (a one-shot ends).
                log.error("schedule %s of %s: its append to %s was refused (%s); firing skipped",
                          s.name, s.instance_id, s.stream, exc.code)
            fired = await self._store().fire_schedule(s, next_due, None, now)
            if fired:
                self._announce(next_due)
            return fired
        document = {
            "offset": 0,
            "id": new_event_id(),
            "at": now,
            "type": event.get("type"),
            "payload": event.get("payload", {}),
            "metadata": event.get("metadata") or {},
            "source": {"instance": s.instance_id, "schedule": s.name},
            "correlation": event.get("correlation"),
            "priority": event.get("priority") or 0,
            "group_id": event.get("group_id"),
            "idempotency_key": None,
            "tenant": s.tenant,
            "path": None,
        }
        item = QueueItem(
            event_json=orjson.dumps(document).decode(), group_id=document["group_id"],
            priority=document["priority"], instance_id=s.instance_id,
        )
        fired = await self._store().fire_schedule(s, next_due, item, now)
        if fired:
            self._on_enqueued(s.tenant)
            self._announce(next_due)  # a cron's next firing, on time
        return fired
