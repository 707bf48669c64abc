"""Ephemeral events appended by other processes, merged into reads in offset order.

On PostgreSQL every process relays the ephemeral events it appends to all
the others (``store/postgres/relay.py``: NOTIFY payloads sent at commit);
each process buffers what it receives in its own ``EphemeralBuffers``,
under the same caps as its own events. A restart forgets them: nothing is
written, and a process receives only what is appended while it listens.

A read must not pass over an ephemeral offset whose event is still on its
way. Offsets without a durable row in a read are ephemeral (pruning removes
a prefix only, refused events take no offset); such a gap is *explained*
when its event is buffered, or when it is at or below the stream's *mark*:
every ephemeral event of the stream up to the mark has arrived (or was
lost with a connection, or came before this process listened). The mark
rises with each relayed event (notifications arrive in commit order, and a
stream's offsets are taken in commit order) and after a barrier: a read
that finds an unexplained gap sends a ping on the relay channel and waits
for it to come back (at most ``BARRIER_TIMEOUT_S``); everything committed
before the read has then arrived, so the mark becomes the read's head.
Concurrent readers share one ping. Marks are kept for the most recently
used ``MAX_MARKS`` streams (a forgotten one costs one more ping).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from .. import metrics
from ..events import Event, PreparedEvent
from ..store.contract import ReadPage
from .ephemeral import EphemeralBuffers
from .wakeups import WakeupHub

if TYPE_CHECKING:
    from ..store.contract import Store

log = logging.getLogger("yoke.streams.relay")

BARRIER_TIMEOUT_S = 2.0
MAX_MARKS = 10_000


class EphemeralRelay:
    def __init__(self, buffers: EphemeralBuffers, hub: WakeupHub) -> None:
        self.buffers = buffers
        self.hub = hub
        self.store: Store | None = None
        self._marks: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._next: asyncio.Future[bool] | None = None  # the ping not sent yet
        self._pings: set[asyncio.Task[None]] = set()
        self.received = 0  # relayed events buffered
        self.barriers = 0  # pings sent

    # --- the listener's side --------------------------------------------------

    def receive(self, tenant: str, path: str, offset: int, at: int, event: PreparedEvent) -> None:
        """An ephemeral event another process appended (from the listener)."""
        self._raise_mark((tenant, path), offset)
        if event.size > self.buffers.max_event_size:
            return  # that process's caps admit more than ours: as if evicted here
        buffer = self.buffers.get(tenant, path)
        if buffer is not None and buffer.has(offset):
            return
        self.buffers.ensure(tenant, path).add(event, offset, at)
        self.received += 1
        metrics.EPHEMERAL_RELAYED.inc()
        self.hub.wake_waiters(tenant, path)

    def _raise_mark(self, key: tuple[str, str], offset: int) -> None:
        marks = self._marks
        if marks.get(key, 0) < offset:
            marks[key] = offset
        if key in marks:
            marks.move_to_end(key)
        while len(marks) > MAX_MARKS:
            marks.popitem(last=False)

    async def stream_deleted(self, tenant: str, path: str) -> None:
        """A stream was deleted: its buffered ephemeral events go (an
        ephemeral commit in flight is waited for, its events dropped too),
        and what was relayed of it."""
        buffer = self.buffers.get(tenant, path)
        if buffer is not None:
            self.buffers.discard(tenant, path)
            await buffer.settled()
            self.buffers.discard(tenant, path)
        self.forget(tenant, path)

    def forget(self, tenant: str, path: str) -> None:
        """The stream was deleted: its mark counted the old stream's offsets."""
        self._marks.pop((tenant, path), None)

    # --- the readers' side ----------------------------------------------------

    async def settle(self, tenant: str, path: str, page: ReadPage, after: int, upto: int) -> None:
        """Return once every ephemeral event of ``(after, upto]`` that was
        committed before ``page`` was read has arrived (or cannot)."""
        key = (tenant, path)
        floor = max(after, self._marks.get(key, 0))
        if upto <= floor or self._explained(tenant, path, page.events, floor, upto):
            return
        # Answered or not, the read goes on past what has not arrived (an
        # unanswered ping means a lost connection, which lost them too).
        await self._barrier()
        self._raise_mark(key, page.head)

    async def settle_one(self, tenant: str, path: str, offset: int, head: int) -> None:
        """``settle`` for a point read of ``offset`` that found no durable row."""
        if offset > self._marks.get((tenant, path), 0):
            buffer = self.buffers.get(tenant, path)
            if buffer is None or not buffer.has(offset):
                await self._barrier()
                self._raise_mark((tenant, path), head)

    def _explained(self, tenant: str, path: str, durable: list[Event], floor: int, upto: int) -> bool:
        """Whether every offset of ``(floor, upto]`` has a durable row in
        ``durable`` or a buffered event (both ascending: walked down together)."""
        buffer = self.buffers.get(tenant, path)
        buffered = buffer.offsets_descending() if buffer is not None else iter(())
        next_buffered = next(buffered, 0)
        index = len(durable) - 1
        offset = upto
        while offset > floor:
            while index >= 0 and durable[index].offset > offset:
                index -= 1
            if index >= 0 and durable[index].offset == offset:
                offset -= 1
                continue
            while next_buffered > offset:
                next_buffered = next(buffered, 0)
            if next_buffered != offset:
                return False
            offset -= 1
        return True

    async def _barrier(self) -> bool:
        """Join the next ping (one not sent yet), or start one."""
        waiter = self._next
        if waiter is None:
            loop = asyncio.get_running_loop()
            waiter = self._next = loop.create_future()
            loop.call_soon(self._send)  # readers settling in this turn join it
        return await asyncio.shield(waiter)

    def _send(self) -> None:
        waiter, self._next = self._next, None
        assert waiter is not None
        task = asyncio.ensure_future(self._ping(waiter))
        self._pings.add(task)
        task.add_done_callback(self._pings.discard)

    async def _ping(self, waiter: asyncio.Future[bool]) -> None:
        self.barriers += 1
        metrics.EPHEMERAL_BARRIERS.inc()
        ok = False
        try:
            assert self.store is not None
            ok = await self.store.ephemeral_barrier(BARRIER_TIMEOUT_S)
        except Exception as exc:  # readers go on: the events count as lost
            log.warning("ephemeral relay barrier failed: %r", exc)
        finally:
            if not ok:
                log.info("ephemeral relay barrier not answered: events in flight count as lost")
            if not waiter.done():
                waiter.set_result(ok)
