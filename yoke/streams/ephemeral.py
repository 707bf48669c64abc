"""Ephemeral events: a real offset, never written to the store.

Each stream keeps the newest ephemeral events of this process (and, on
PostgreSQL, those other processes relayed: ``relay.py``) in memory,
evicting the oldest first; a restart forgets them (the stream row's head
still remembers their offsets, so they are never reused).

Merging them into a read must not reorder or skip anything:

- A group commit can hold both kinds. Its durable rows become visible at
  commit, its ephemeral events enter the buffer a moment later, when the
  appender resumes. A read that sees such a commit's rows waits for that
  commit to settle (``settled``) before merging: groups with ephemeral
  events run alone, so there is at most one to wait for.
- The buffer may already hold ephemeral events newer than the read's
  snapshot; only those up to the snapshot's head are merged, the rest come
  with the next read.
- Eviction only ever removes a stream's oldest buffered event, so what is
  left is always the newest, in offset order. An evicted event is simply no
  longer readable: a read or tail passes over its offset as over any
  offset without an event.

Memory is bounded three ways (docs/production/memory.md): per stream
(``ephemeral_buffer_bytes``), per tenant (``ephemeral_tenant_bytes``) and
per process (``ephemeral_process_bytes``). Whichever is exceeded, the oldest
event under it goes first: the stream's own, the tenant's or the process's
oldest, across all of its streams. Each buffered event is charged its
``PreparedEvent.size`` plus ``EVENT_OVERHEAD``, and each stream holding
events ``STREAM_OVERHEAD``, so that the charge follows what the process
really holds even for tiny events spread over many streams; the JSON texts
are kept as UTF-8 bytes and decoded on read, so no payload shape can make
the memory used much larger than the charge. A stream whose buffer empties
is forgotten.

Eviction is O(log n) per event (n: streams holding events): the tenant and
the process each keep a heap of their streams keyed by the age (a process
sequence number) of each stream's oldest event. Keys are only lower bounds
(a stream's own cap may have evicted its head since), corrected when the
entry reaches the top; streams dropped from the map leave stale entries
that the heap sheds when it grows past twice the live streams.
"""

from __future__ import annotations

import asyncio
import heapq
from collections import deque
from dataclasses import replace
from collections.abc import Iterator
from itertools import islice
from typing import TYPE_CHECKING

import orjson

from .. import errors
from ..events import Event, PreparedEvent
from ..store.contract import ReadPage

if TYPE_CHECKING:
    from ..config import Settings

# Charged per buffered event on top of its size: the entry, its strings'
# headers, the offset and time (about 400 bytes measured on CPython 3.11).
EVENT_OVERHEAD = 512
# Charged per stream while it holds events: the buffer, its deque, its map
# entry and heap slots (about 900 bytes measured).
STREAM_OVERHEAD = 1024

# Heaps are rebuilt from the live streams when they hold more than this
# many times as many entries (plus a constant, for small heaps).
_SLACK = 2
_SLACK_MIN = 64

HeapEntry = tuple[int, "EphemeralBuffer"]


class _Entry:
    """One buffered event, compact: its JSON texts as UTF-8 bytes."""

    __slots__ = (
        "seq", "offset", "at", "charge", "id", "type", "payload", "metadata", "source",
        "correlation", "priority", "group_id",
    )  # fmt: skip

    def __init__(self, seq: int, prepared: PreparedEvent, offset: int, at: int) -> None:
        self.seq = seq
        self.offset = offset
        self.at = at
        self.charge = prepared.size + EVENT_OVERHEAD
        self.id = prepared.id
        self.type = prepared.type
        self.payload = prepared.payload_json.encode()
        self.metadata = prepared.metadata_json.encode()
        self.source = prepared.source_json.encode() if prepared.source_json else None
        self.correlation = prepared.correlation
        self.priority = prepared.priority
        self.group_id = prepared.group_id

    def event(self, tenant: str, path: str) -> Event:
        return Event(
            offset=self.offset,
            id=self.id,
            at=self.at,
            type=self.type,
            payload=orjson.loads(self.payload),
            metadata=orjson.loads(self.metadata),
            source=orjson.loads(self.source) if self.source is not None else None,
            correlation=self.correlation,
            priority=self.priority,
            group_id=self.group_id,
            idempotency_key=None,  # an ephemeral event never has one
            tenant=tenant,
            path=path,
            ephemeral=True,
        )


class _Tenant:
    """One tenant's share: its charged bytes, its live buffers, its heap."""

    __slots__ = ("name", "bytes", "buffers", "heap")

    def __init__(self, name: str) -> None:
        self.name = name
        self.bytes = 0
        self.buffers = 0  # buffers of this tenant in the map (empty pending ones too)
        self.heap: list[HeapEntry] = []


class EphemeralBuffer:
    """The buffered ephemeral events of one stream, oldest first."""

    __slots__ = (
        "tenant", "path", "_owner", "_share", "_entries", "_bytes", "_pending",
        "_in_tenant_heap", "_in_process_heap", "lifetime",
    )  # fmt: skip

    def __init__(self, owner: EphemeralBuffers, share: _Tenant, tenant: str, path: str) -> None:
        self.tenant = tenant
        self.path = path
        self._owner = owner
        self._share = share
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._pending: asyncio.Future[None] | None = None  # an ephemeral commit in flight
        self._in_tenant_heap = False
        self._in_process_heap = False
        # The stream_id of the stream the last merged read saw: events
        # buffered for an earlier stream on this path are dropped, not merged.
        self.lifetime: str | None = None

    def __lt__(self, other: EphemeralBuffer) -> bool:
        return False  # heap entries are ordered by their key alone

    # --- the appender's side ------------------------------------------------

    def begin_commit(self) -> None:
        self._pending = asyncio.get_running_loop().create_future()

    def end_commit(self) -> None:
        if self._pending is not None and not self._pending.done():
            self._pending.set_result(None)
        self._pending = None
        if not self._entries:
            self._owner._free(self)

    def add(self, prepared: PreparedEvent, offset: int, at: int) -> None:
        """Buffer an ephemeral event that took ``offset``, evicting the oldest
        events of the stream, its tenant or the process past their caps."""
        self._owner._add(self, prepared, offset, at)

    def has(self, offset: int) -> bool:
        for entry in reversed(self._entries):
            if entry.offset <= offset:
                return entry.offset == offset
        return False

    # --- the readers' side --------------------------------------------------

    async def settled(self) -> None:
        """Wait for the ephemeral commit in flight (if any) to settle."""
        pending = self._pending
        if pending is not None:
            await asyncio.shield(pending)

    def get(self, offset: int) -> Event | None:
        for entry in reversed(self._entries):
            if entry.offset == offset:
                return entry.event(self.tenant, self.path)
            if entry.offset < offset:
                break
        return None

    def merge_page(self, page: ReadPage, after: int, limit: int, max_bytes: int | None = None) -> ReadPage:
        """``page`` (durable events with offset > after, ascending, at most
        ``limit`` and ``max_bytes``, read in a snapshot whose head is
        ``page.head``) with the buffered ephemeral events merged in, in
        offset order, within the same two caps. Ephemeral events are merged
        up to the head, or, when the durable page was cut by a cap, up to
        its last event only (durable events after it were not read)."""
        durable = page.events
        upto = durable[-1].offset if page.capped or len(durable) >= limit else page.head
        selected: list[_Entry] = []
        for entry in reversed(self._entries):  # readers mostly want the newest
            if entry.offset <= after:
                break
            if entry.offset <= upto:
                selected.append(entry)
        if not selected:
            return page
        selected.reverse()
        sizes = dict(zip((e.offset for e in durable), page.sizes))
        events: list[Event] = []
        kept: list[int] = []
        total = 0
        capped = page.capped
        for item in islice(heapq.merge(durable, selected, key=_offset), limit):
            size = item.charge - EVENT_OVERHEAD if isinstance(item, _Entry) else sizes.get(item.offset, 0)
            if max_bytes is not None and events and total + size > max_bytes:
                capped = True
                break
            total += size
            events.append(item.event(self.tenant, self.path) if isinstance(item, _Entry) else item)
            kept.append(size)
        return replace(page, events=events, sizes=kept, capped=capped)

    @property
    def bytes(self) -> int:
        """What this stream's events are charged (sizes plus overheads)."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def offsets(self) -> Iterator[int]:
        return (entry.offset for entry in self._entries)

    def offsets_descending(self) -> Iterator[int]:
        return (entry.offset for entry in reversed(self._entries))


def _offset(item: Event | _Entry) -> int:
    return item.offset


class EphemeralBuffers:
    """The buffers of this process, one per stream holding ephemeral events
    (or with an ephemeral commit in flight), and the caps across them."""

    def __init__(
        self, stream_bytes: int, tenant_bytes: int | None = None, process_bytes: int | None = None
    ) -> None:
        self.stream_bytes = stream_bytes
        self.tenant_bytes = stream_bytes + STREAM_OVERHEAD if tenant_bytes is None else tenant_bytes
        self.process_bytes = self.tenant_bytes if process_bytes is None else process_bytes
        # The largest event size every cap admits on its own (an event too
        # large for it is refused before it takes an offset).
        self.max_event_size = min(
            self.stream_bytes - EVENT_OVERHEAD,
            self.tenant_bytes - EVENT_OVERHEAD - STREAM_OVERHEAD,
            self.process_bytes - EVENT_OVERHEAD - STREAM_OVERHEAD,
        )
        if self.max_event_size < 1:
            raise errors.InvalidInput(
                "the ephemeral caps must each leave room for one event: at least "
                f"{EVENT_OVERHEAD + 1} bytes per stream and {EVENT_OVERHEAD + STREAM_OVERHEAD + 1}"
                " per tenant and per process",
                field="ephemeral_buffer_bytes",
            )
        self._buffers: dict[tuple[str, str], EphemeralBuffer] = {}
        self._tenants: dict[str, _Tenant] = {}
        self._heap: list[HeapEntry] = []  # the process's streams by their oldest event
        self._seq = 0
        self.bytes = 0  # charged, across every stream of the process
        self.events = 0
        self.evicted = {"stream": 0, "tenant": 0, "process": 0}

    @classmethod
    def from_settings(cls, settings: Settings) -> EphemeralBuffers:
        return cls(
            settings.ephemeral_buffer_bytes,
            settings.ephemeral_tenant_bytes,
            settings.ephemeral_process_bytes,
        )

    # --- lookups --------------------------------------------------------------

    def get(self, tenant: str, path: str) -> EphemeralBuffer | None:
        return self._buffers.get((tenant, path))

    def ensure(self, tenant: str, path: str) -> EphemeralBuffer:
        buffer = self._buffers.get((tenant, path))
        if buffer is None:
            share = self._tenants.get(tenant)
            if share is None:
                share = self._tenants[tenant] = _Tenant(tenant)
            buffer = self._buffers[(tenant, path)] = EphemeralBuffer(self, share, tenant, path)
            share.buffers += 1
        return buffer

    def __len__(self) -> int:
        """Streams with a buffer (holding events, or an ephemeral commit in flight)."""
        return len(self._buffers)

    def tenant_usage(self, tenant: str) -> int:
        """What ``tenant``'s buffered events are charged in this process."""
        share = self._tenants.get(tenant)
        return 0 if share is None else share.bytes

    def tenants(self) -> dict[str, int]:
        """Charged bytes per tenant holding ephemeral events."""
        return {name: share.bytes for name, share in self._tenants.items() if share.bytes}

    def of_lifetime(self, buffer: EphemeralBuffer, stream_id: str) -> EphemeralBuffer | None:
        """``buffer``, for a read of the stream ``stream_id``: emptied first
        when it was merged into reads of an earlier stream on its path (one
        deleted and created again, whose events another process relayed)."""
        if buffer.lifetime is not None and buffer.lifetime != stream_id:
            self.discard(buffer.tenant, buffer.path)
            found = self._buffers.get((buffer.tenant, buffer.path))
            if found is None:
                return None
            buffer = found
        buffer.lifetime = stream_id
        return buffer

    def discard(self, tenant: str, path: str) -> None:
        """Forget every buffered event of a deleted stream (its heap entries
        go when they surface or when a heap is rebuilt)."""
        buffer = self._buffers.get((tenant, path))
        if buffer is None:
            return
        entries = buffer._entries
        if entries:
            charge = buffer._bytes + STREAM_OVERHEAD
            buffer._share.bytes -= charge
            self.bytes -= charge
            self.events -= len(entries)
            entries.clear()
            buffer._bytes = 0
        if buffer._pending is None:
            self._free(buffer)

    # --- adding and evicting ------------------------------------------------------

    def _add(self, buffer: EphemeralBuffer, prepared: PreparedEvent, offset: int, at: int) -> None:
        self._seq = seq = self._seq + 1
        entry = _Entry(seq, prepared, offset, at)
        share = buffer._share
        entries = buffer._entries
        charge = entry.charge
        filled = not entries
        if entries and entries[-1].offset > offset:
            # Relayed from another process after a later local one: keep
            # the buffer in offset order (the heaps' keys stay lower bounds).
            position = len(entries)
            while position and entries[position - 1].offset > offset:
                position -= 1
            entries.insert(position, entry)
        else:
            entries.append(entry)
        buffer._bytes += charge
        if filled:
            charge += STREAM_OVERHEAD
            self._filled(buffer, share, seq)
        share.bytes += charge
        self.bytes += charge
        self.events += 1
        # Each cap admits the new event alone, so these loops end with it or
        # without it (it is the newest everywhere unless it was relayed in
        # below a later offset: then it is the stream's first to go).
        while buffer._bytes > self.stream_bytes:
            self._evict(buffer, "stream")
        while share.bytes > self.tenant_bytes:
            self._evict_oldest(share.heap, tenant=True)
        while self.bytes > self.process_bytes:
            self._evict_oldest(self._heap, tenant=False)
        if filled:
            # The heaps grew: shed the entries of forgotten streams once
            # they are the majority (so a heap never holds more than about
            # twice the streams it had at its last push).
            if len(self._heap) > _SLACK * len(self._buffers) + _SLACK_MIN:
                self._heap = self._rebuilt(self._heap, tenant=False)
            if len(share.heap) > _SLACK * share.buffers + _SLACK_MIN:
                share.heap = self._rebuilt(share.heap, tenant=True)

    def _filled(self, buffer: EphemeralBuffer, share: _Tenant, seq: int) -> None:
        """``buffer`` gets its first event (sequence ``seq``): enter the heaps.
        A buffer still listed holds a key older than ``seq``, a valid lower
        bound, so it is left as it is."""
        if not buffer._in_tenant_heap:
            buffer._in_tenant_heap = True
            heapq.heappush(share.heap, (seq, buffer))
        if not buffer._in_process_heap:
            buffer._in_process_heap = True
            heapq.heappush(self._heap, (seq, buffer))

    @staticmethod
    def _rebuilt(heap: list[HeapEntry], *, tenant: bool) -> list[HeapEntry]:
        """The heap without the entries of empty (or forgotten) buffers."""
        live: list[HeapEntry] = []
        for _, buffer in heap:
            if buffer._entries:
                live.append((buffer._entries[0].seq, buffer))
            elif tenant:
                buffer._in_tenant_heap = False
            else:
                buffer._in_process_heap = False
        heapq.heapify(live)
        return live

    def _evict_oldest(self, heap: list[HeapEntry], *, tenant: bool) -> None:
        """Evict the oldest event of the streams in ``heap``."""
        while True:
            key, buffer = heap[0]
            entries = buffer._entries
            if not entries:  # emptied by another cap (and maybe forgotten)
                heapq.heappop(heap)
                if tenant:
                    buffer._in_tenant_heap = False
                else:
                    buffer._in_process_heap = False
                continue
            oldest = entries[0].seq
            if oldest != key:  # its own cap evicted the head since: re-key
                heapq.heapreplace(heap, (oldest, buffer))
                continue
            self._evict(buffer, "tenant" if tenant else "process")
            if entries:
                heapq.heapreplace(heap, (entries[0].seq, buffer))
            else:
                heapq.heappop(heap)
                if tenant:
                    buffer._in_tenant_heap = False
                else:
                    buffer._in_process_heap = False
            return

    def _evict(self, buffer: EphemeralBuffer, cap: str) -> None:
        entry = buffer._entries.popleft()
        charge = entry.charge
        buffer._bytes -= charge
        if not buffer._entries:
            charge += STREAM_OVERHEAD
        buffer._share.bytes -= charge
        self.bytes -= charge
        self.events -= 1
        self.evicted[cap] += 1
        if not buffer._entries and buffer._pending is None:
            self._free(buffer)

    def _free(self, buffer: EphemeralBuffer) -> None:
        """Forget an empty buffer with no commit in flight. Its heap entries
        go when they surface or when the heap is rebuilt."""
        key = (buffer.tenant, buffer.path)
        if self._buffers.get(key) is not buffer:
            return
        del self._buffers[key]
        share = buffer._share
        share.buffers -= 1
        if share.buffers == 0:
            del self._tenants[buffer.tenant]
