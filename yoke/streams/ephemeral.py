"""Ephemeral events: a real offset, never written to the store.

Each stream keeps the newest ephemeral events of this process in memory, up
to a byte budget, evicting the oldest first; a restart forgets them (the
stream row's head still remembers their offsets, so they are never reused).

Merging them into a read must not reorder or skip anything:

- A group commit can hold both kinds. Its durable rows become visible at
  commit, its ephemeral events enter the buffer a moment later, when the
  appender resumes. A read that sees such a commit's rows waits for that
  commit to settle (``settled``) before merging: groups with ephemeral
  events run alone, so there is at most one to wait for.
- The buffer may already hold ephemeral events newer than the read's
  snapshot; only those up to the snapshot's head are merged, the rest come
  with the next read.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque

from ..events import Event


class EphemeralBuffer:
    __slots__ = ("_events", "_bytes", "budget", "_pending")

    def __init__(self, budget: int) -> None:
        self._events: deque[tuple[Event, int]] = deque()
        self._bytes = 0
        self.budget = budget
        self._pending: asyncio.Future[None] | None = None  # an ephemeral commit in flight

    # --- the appender's side ------------------------------------------------

    def begin_commit(self) -> None:
        self._pending = asyncio.get_running_loop().create_future()

    def end_commit(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.set_result(None)
        self._pending = None

    def add(self, event: Event, size: int) -> None:
        self._events.append((event, size))
        self._bytes += size
        while self._bytes > self.budget and self._events:
            _, evicted = self._events.popleft()
            self._bytes -= evicted

    # --- the readers' side --------------------------------------------------

    async def settled(self) -> None:
        """Wait for the ephemeral commit in flight (if any) to settle."""
        pending = self._pending
        if pending is not None:
            await asyncio.shield(pending)

    def get(self, offset: int) -> Event | None:
        for event, _ in self._events:
            if event.offset == offset:
                return event
        return None

    def merge(self, durable: list[Event], head: int, after: int, limit: int) -> list[Event]:
        """Durable events (offset > after, ascending, from a snapshot whose
        head is ``head``) merged with the buffered ephemeral events in
        (after, head], in offset order, at most ``limit``."""
        ephemeral = [e for e, _ in self._events if after < e.offset <= head]
        if not ephemeral:
            return durable[:limit]
        return list(heapq.merge(durable, ephemeral, key=lambda e: e.offset))[:limit]

    @property
    def bytes(self) -> int:
        return self._bytes


class EphemeralBuffers:
    """One buffer per stream, created on the stream's first ephemeral event."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self._buffers: dict[tuple[str, str], EphemeralBuffer] = {}

    def get(self, tenant: str, path: str) -> EphemeralBuffer | None:
        return self._buffers.get((tenant, path))

    def ensure(self, tenant: str, path: str) -> EphemeralBuffer:
        buffer = self._buffers.get((tenant, path))
        if buffer is None:
            buffer = self._buffers[(tenant, path)] = EphemeralBuffer(self.budget)
        return buffer
