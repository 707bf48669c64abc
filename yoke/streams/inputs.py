"""Input records and their wake events (the input outbox).

> Input records and their delivery outbox commit together. A dispatcher
> publishes a deterministic event through the existing workflow wait
> service, so streams do not create another resume authority.

``Stream.append_input`` appends records and, in the same transaction, one
outbox row per new record (``store.outbox``). The dispatcher of every
process publishes each row's wake event on the row's wake stream, an
ordinary append that wakes whatever waits there the usual way (tails, actor
instances whose filter matches, subscriptions), then deletes the row. The
wake event is deterministic: its id and idempotency key are derived from
the input stream's lifetime id and the record's offset, so

- a crash between the commit and the publish loses nothing: the row stays,
  and any process's dispatcher publishes it (the one that appended at
  once, the others within ``input_dispatch_s``);
- a crash between the publish and the row's deletion duplicates nothing:
  publishing again finds the key and returns the original event, as does
  a second process publishing the same row at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..clock import SYSTEM, Clock, wall_ms
from ..events import prepare
from ..store import OpenStore
from ..store.faults import log_retried
from ..store.outbox import Delivery

if TYPE_CHECKING:
    from .append import AppendService

log = logging.getLogger("yoke.streams.inputs")

WAKE_TYPE = "yoke.input.received"
BATCH = 100
RETRY_MAX_S = 60.0


def wake_key(lifetime_id: str, offset: int) -> str:
    return f"yoke:input:{lifetime_id}:{offset}"


def wake_id(lifetime_id: str, offset: int) -> str:
    return hashlib.sha256(wake_key(lifetime_id, offset).encode()).hexdigest()[:32]


def wake_event(delivery: Delivery) -> dict[str, Any]:
    return {
        "type": WAKE_TYPE,
        "payload": {
            "stream": delivery.path, "sequence": delivery.offset, "record_id": delivery.record_id,
            "lifetime_id": delivery.lifetime_id,
        },
        "idempotency_key": wake_key(delivery.lifetime_id, delivery.offset),
    }


class InputDispatcher:
    def __init__(
        self, store: OpenStore, appends: AppendService, *, max_event_bytes: int, clock: Clock = SYSTEM
    ) -> None:
        self._store = store
        self._clock = clock  # what is due, and when a failed one is retried
        self._appends = appends
        self._max_event_bytes = max_event_bytes
        self._kick = asyncio.Event()
        self.published = 0

    def kick(self) -> None:
        """Rows were just written here: dispatch now rather than at the next poll."""
        self._kick.set()

    async def run_forever(self, interval_s: float) -> None:
        while True:
            self._kick.clear()
            try:
                while await self.dispatch_once() >= BATCH:
                    pass
            except Exception:
                log_retried(log, "input dispatch failed")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval_s):
                    await self._kick.wait()

    async def dispatch_once(self) -> int:
        """Publish what is due; returns how many rows were due."""
        store = self._store()
        due = await store.outbox.due(wall_ms(self._clock), BATCH)
        for delivery in due:
            try:
                await self.publish(delivery)
            except Exception as exc:
                delay = min(2.0 ** delivery.attempts, RETRY_MAX_S)
                log.warning("wake event for %s %s@%d failed: %r; again in %.0f s",
                            delivery.tenant, delivery.path, delivery.offset, exc, delay)
                await store.outbox.retry(
                    delivery.tenant, delivery.path, delivery.offset, wall_ms(self._clock) + int(delay * 1000), repr(exc)
                )
                continue
            await store.outbox.done(delivery.tenant, delivery.path, delivery.offset)
        return len(due)

    async def publish(self, delivery: Delivery) -> None:
        prepared = prepare(wake_event(delivery), trusted=True, max_event_bytes=self._max_event_bytes)
        prepared = replace(prepared, id=wake_id(delivery.lifetime_id, delivery.offset))
        await self._appends.append(delivery.tenant, delivery.wake_path, [prepared])
        self.published += 1
