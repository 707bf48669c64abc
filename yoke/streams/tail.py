"""Tail: backfill, then live, following the continuity loop, until the
stream is closed.

1. Subscribe to wake-ups before reading anything.
2. Backfill: read events with offset > cursor from the store.
3. Follow: on every wake-up (or every sweep interval) read again after the
   cursor; boundary duplicates (offset <= cursor) are dropped.
4. Repair: because every read starts at the cursor in the store, a missed
   or coalesced wake-up can delay an event but never skip it.
5. End: a read that reaches the head of a closed stream (closed and head
   come from the read's own snapshot) ends the tail once its events are
   delivered. A close wakes this process's tails; other processes' tails
   see it at their next sweep.

Tails at the same cursor share their reads (``SharedReads``), so a wake-up
costs one store read per stream and cursor, not one per tail.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from .. import errors
from ..events import Event
from ..routing.filters import Filter
from ..store.contract import ReadPage
from .rules import READ, Admission
from .wakeups import WakeupHub

if TYPE_CHECKING:
    from .kernel import StreamKernel


class Followed(Protocol):
    """What a tail asks of its stream's handle (``handle.Stream``)."""

    kernel: StreamKernel
    tenant: str
    path: str

    async def admission(self, action: str) -> Admission: ...

    async def read_admitted(
        self, after: int, limit: int, *, include_ephemeral: bool, max_bytes: int | None
    ) -> ReadPage: ...

    def _check_cursor(self, page: ReadPage, after: int) -> None: ...

PAGE = 1000
# A page is also capped by bytes (the events' sizes as stored): with events
# of 64 KiB, 1000 of them were 64 MB held by each tail at its own cursor
# (and once more as SSE frames). HTTP reads (GET .../-/events) use it too.
PAGE_BYTES = 1024 * 1024
log = logging.getLogger("yoke.streams.tail")


class SharedReads:
    """Tails of one stream at one cursor share one store read.

    When an append wakes 500 tails, they would all read the same page; the
    first starts the read and the others wait for its result. A tail may
    only join a read that started after its own wake-up (by the hub's
    clock), so what it gets always includes the commit that woke it.
    """

    def __init__(self, hub: WakeupHub) -> None:
        self._hub = hub
        self._inflight: dict[tuple[Any, ...], tuple[int, asyncio.Future[ReadPage]]] = {}

    async def read(
        self, stream: Followed, after: int, include_ephemeral: bool, fresh_since: int
    ) -> ReadPage:
        key = (stream.tenant, stream.path, after, include_ephemeral)
        entry = self._inflight.get(key)
        if entry is None or entry[0] < fresh_since:
            # The read runs as its own task: a tail that goes away while
            # waiting cancels only its wait, never the others' read.
            task = asyncio.ensure_future(
                stream.read_admitted(after, PAGE, include_ephemeral=include_ephemeral, max_bytes=PAGE_BYTES)
            )
            task.add_done_callback(_consume)
            entry = self._inflight[key] = (self._hub.clock, task)
            task.add_done_callback(lambda _: self._forget(key, entry))
        return await asyncio.shield(entry[1])

    def _forget(self, key: tuple[Any, ...], entry: tuple[int, asyncio.Future[ReadPage]]) -> None:
        if self._inflight.get(key) is entry:
            del self._inflight[key]


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: joiners may all have gone


async def follow(
    stream: Followed,
    after: int,
    *,
    include_ephemeral: bool,
    sweep_s: float,
    idle_s: float | None = None,
    stop: asyncio.Event | None = None,
    event_filter: Filter | None = None,
) -> AsyncIterator[list[Event]]:
    """The continuity loop, yielding each new batch of events in order; it
    returns once it has yielded everything up to the head of a closed
    stream, and raises ``StreamDeleted`` once the stream it followed is
    gone (deleted, or deleted and created again). When ``idle_s`` is given, an empty batch is yielded after that
    long without events (a chance to send a heartbeat); ``stop`` ends the
    loop early; ``event_filter`` keeps only the events it matches (the
    cursor still moves past the others)."""
    kernel = stream.kernel
    hub = kernel.hub
    # Admitted once (a stream's pins are fixed for its life; another lifetime
    # on the path ends the tail): reads are shared, each tail masks its own.
    admission = await stream.admission(READ)
    waiter = hub.subscribe(stream.tenant, stream.path)
    loop = asyncio.get_running_loop()
    try:
        cursor = after
        lifetime: str | None = None  # the stream_id of the stream being followed
        fresh_since = hub.clock
        quiet_since = loop.time()
        cause = "start"  # what made this read: start, notify, sweep, resync, more
        while stop is None or not stop.is_set():
            if kernel.closed():
                raise errors.RuntimeClosed("the runtime is shutting down")
            try:
                page = await kernel.shared_reads.read(stream, cursor, include_ephemeral, fresh_since)
            except errors.Unavailable as exc:
                # The database is away (the read already retried for a few
                # seconds): keep the cursor and read again at the next
                # wake-up, at the latest the hub's sweep, or the listener's
                # resync once it has reconnected.
                log.warning("tail of %s %s: %s; retrying", stream.tenant, stream.path, exc.message)
                cause = await waiter.wait()
                fresh_since = hub.clock
                continue
            except errors.YokeError:
                raise
            except Exception as exc:  # a transient store failure: retry from the cursor
                log.warning("tail of %s %s: read failed (%r); retrying", stream.tenant, stream.path, exc)
                await asyncio.sleep(min(sweep_s, 1.0))
                continue
            if page.exists and lifetime is None:
                lifetime = page.stream_id
            elif lifetime is not None and page.stream_id != lifetime:  # gone, or a new stream on its path
                raise errors.StreamDeleted(
                    f"stream {stream.path} was deleted", path=stream.path, stream_id=lifetime, after=cursor
                )
            if not page.exists:  # not created yet: wait for it as for an empty stream
                stream._check_cursor(page, cursor)
            events = page.events
            fresh = [e for e in events if e.offset > cursor]  # drop boundary duplicates
            if fresh:
                cursor = fresh[-1].offset
                if cause in ("sweep", "resync"):  # found without a wake-up: a live gap?
                    kernel.gaps.check(stream.tenant, stream.path, cause, fresh)
                fresh = admission.mask(fresh)  # before the filter: it sees what the reader may
                if event_filter is not None:  # a FilterError ends the tail with it
                    fresh = await kernel.evaluations.select(stream.tenant, event_filter, fresh)
            if fresh:
                quiet_since = loop.time()
                yield fresh
            elif idle_s is not None and loop.time() - quiet_since >= idle_s:
                quiet_since = loop.time()
                yield []
            cause = "more"  # reading on at once: not a gap
            if len(events) < PAGE and not page.capped:  # read through the head
                if page.closed:
                    return
                cause = await waiter.wait()  # an append, or the hub's sweep
            fresh_since = hub.clock
    finally:
        waiter.close()


async def tail(
    stream: Followed, after: int, *, include_ephemeral: bool, sweep_s: float,
    event_filter: Filter | None = None,
) -> AsyncIterator[Event]:
    batches = follow(
        stream, after, include_ephemeral=include_ephemeral, sweep_s=sweep_s, event_filter=event_filter
    )
    try:
        async for batch in batches:
            for event in batch:
                yield event
    except errors.StreamDeleted:
        return  # a deleted stream's tail ends like a closed one's
    finally:
        await batches.aclose()
