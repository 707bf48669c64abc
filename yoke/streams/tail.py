"""Tail: backfill, then live, forever, following the continuity loop.

1. Subscribe to wake-ups before reading anything.
2. Backfill: read events with offset > cursor from the store.
3. Follow: on every wake-up (or every sweep interval) read again after the
   cursor; boundary duplicates (offset <= cursor) are dropped.
4. Repair: because every read starts at the cursor in the store, a missed
   or coalesced wake-up can delay an event but never skip it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from .. import errors
from ..events import Event

if TYPE_CHECKING:
    from .handle import Stream

PAGE = 1000
log = logging.getLogger("yoke.streams.tail")


async def tail(
    stream: Stream, after: int, *, include_ephemeral: bool, sweep_s: float
) -> AsyncIterator[Event]:
    runtime = stream.runtime
    waiter = runtime.hub.subscribe(stream.tenant, stream.path)
    try:
        cursor = after
        while True:
            if runtime.closed:
                raise errors.RuntimeClosed("the runtime is shutting down")
            try:
                events = await stream.read(after=cursor, limit=PAGE, include_ephemeral=include_ephemeral)
            except errors.YokeError:
                raise
            except Exception as exc:  # a transient store failure: retry from the cursor
                log.warning("tail of %s %s: read failed (%r); retrying", stream.tenant, stream.path, exc)
                await asyncio.sleep(min(sweep_s, 1.0))
                continue
            for event in events:
                if event.offset <= cursor:
                    continue
                cursor = event.offset
                yield event
            if len(events) < PAGE:
                await waiter.wait(sweep_s)
    finally:
        waiter.close()
