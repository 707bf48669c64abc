"""Server-Sent Events for live tails.

Each event is sent as ``id: <offset>`` plus ``data: <event JSON>``, so a
client reconnecting with ``Last-Event-ID`` (or ``?after=``) resumes exactly
after the last event it saw. Comment lines keep idle connections open. The
tail itself follows the continuity loop (``streams.tail``); a failure such
as ``cursor_gone`` is sent as an ``error`` event before the stream ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
from starlette.responses import StreamingResponse

from .. import errors, metrics
from ..events import Event
from ..streams.handle import Stream

HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def encode(event: Event) -> bytes:
    return b"id: %d\ndata: %s\n\n" % (event.offset, orjson.dumps(event.to_dict()))


def encode_error(error: errors.YokeError) -> bytes:
    return b"event: error\ndata: %s\n\n" % orjson.dumps({"error": error.to_dict()})


async def resolve_cursor(stream: Stream, after: int | None, last_event_id: str | None) -> int:
    """``Last-Event-ID`` (a reconnect) wins over ``?after=``; the cursor is
    checked before the response starts, so a bad one is a plain 400/410."""
    cursor = after or 0
    if last_event_id:
        try:
            cursor = int(last_event_id)
        except ValueError:
            raise errors.InvalidCursor("Last-Event-ID must be an offset", requested=last_event_id) from None
    await stream.read(after=cursor, limit=1)
    return cursor


def tail_response(
    stream: Stream,
    after: int,
    *,
    include_ephemeral: bool,
    heartbeat_s: float,
    shutdown: asyncio.Event,
) -> StreamingResponse:
    return StreamingResponse(
        _events(stream, after, include_ephemeral, heartbeat_s, shutdown),
        media_type="text/event-stream",
        headers=HEADERS,
    )


async def _events(
    stream: Stream, after: int, include_ephemeral: bool, heartbeat_s: float, shutdown: asyncio.Event
) -> AsyncIterator[bytes]:
    tail = stream.tail(after=after, include_ephemeral=include_ephemeral)
    stopping = asyncio.ensure_future(shutdown.wait())
    pending: asyncio.Future[Event] | None = None
    metrics.OPEN_TAILS.inc()
    try:
        yield b": tailing\n\n"
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(tail))
            done, _ = await asyncio.wait({pending, stopping}, timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
            if pending in done:
                future, pending = pending, None
                try:
                    event = future.result()
                except errors.YokeError as exc:
                    yield encode_error(exc)
                    return
                yield encode(event)
            elif stopping in done:
                return  # the server is shutting down: end the response cleanly
            else:
                yield b": ping\n\n"
    finally:
        metrics.OPEN_TAILS.dec()
        stopping.cancel()
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pending
        await tail.aclose()
