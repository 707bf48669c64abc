"""Ephemeral events: a real offset, never written to the store.

Each stream keeps the newest ephemeral events of this process in memory, up
to a byte budget, evicting the oldest first; a restart forgets them (the
stream row's head still remembers their offsets, so they are never reused).

Ordering with durable events: a group commit can hold both. Its durable rows
become visible to readers at commit, while its ephemeral events enter the
buffer a moment later, when the appender resumes. So while such a commit is
in flight, readers only trust durable events up to ``settled_head`` (the
head after the last commit whose ephemerals are buffered); the rest is
delivered on the next read, which the commit's wake-up triggers.
"""

from __future__ import annotations

import heapq
from collections import deque

from ..events import Event


class EphemeralBuffer:
    __slots__ = ("_events", "_bytes", "budget", "inflight", "settled_head")

    def __init__(self, budget: int) -> None:
        self._events: deque[tuple[Event, int]] = deque()
        self._bytes = 0
        self.budget = budget
        self.inflight = 0  # commits holding ephemeral events not yet settled
        self.settled_head = 0

    def add(self, event: Event, size: int) -> None:
        self._events.append((event, size))
        self._bytes += size
        while self._bytes > self.budget and self._events:
            _, evicted = self._events.popleft()
            self._bytes -= evicted

    def after(self, offset: int) -> list[Event]:
        return [e for e, _ in self._events if e.offset > offset]

    def get(self, offset: int) -> Event | None:
        for event, _ in self._events:
            if event.offset == offset:
                return event
        return None

    def merge(self, durable: list[Event], after: int, limit: int) -> list[Event]:
        """Durable events (offset > after, ascending) merged with the
        buffered ephemeral ones, in offset order, at most ``limit``."""
        if self.inflight:
            durable = [e for e in durable if e.offset <= self.settled_head]
        ephemeral = self.after(after)
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
