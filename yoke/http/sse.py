"""Server-Sent Events for live tails.

Each event is sent as ``id: <offset>`` plus ``data: <event JSON>``, so a
client reconnecting with ``Last-Event-ID`` (or ``?after=``) resumes exactly
after the last event it saw. Comment lines keep idle connections open. The
tail itself follows the continuity loop (``streams.tail.follow``); events
that arrive together are written together, each encoded once for all the
tails that send it, and written in chunks of at most ``CHUNK`` bytes: the
server's flow control waits for a slow client between chunks, so a tail
that does not read holds one page (``streams.tail.PAGE_BYTES``) and a chunk
or two, not the whole page encoded in its socket's buffer. A filter (``?types=``, ``?where=``) keeps only the
events it matches. A failure such as ``cursor_gone`` or ``filter_failed``
is sent as an ``error`` event before the stream ends. A tail of a closed
stream ends once it has sent everything up to the head, with a final
``event: closed`` (``data: {"path", "closed": true}``); a tail of a stream
that is deleted ends with ``event: deleted`` (``data: {"path", "deleted":
true, "stream_id"}``: the deleted stream's id); a server shutting
down ends tails without it (reconnect elsewhere with ``Last-Event-ID``).
"""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import orjson
from starlette.responses import StreamingResponse

from .. import errors, metrics
from ..events import DIGITS_RE, MAX_OFFSET, Event
from ..routing.filters import Filter
from ..streams.connections import Connection
from ..streams.stream import Stream
from ..streams.tail import follow

HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
# The most written to the connection at once. uvicorn pauses the writer while
# its transport holds more than 64 KiB unsent (the ASGI send then waits for
# the client to drain it), so what a stalled client costs is one chunk past that.
CHUNK = 64 * 1024
# Live tails this process serves, by tenant (the overview's open tails).
OPEN_TAILS: Counter[str] = Counter()


class FrameCache:
    """Recently encoded events: with many tails on one stream, each event is
    serialized once rather than once per tail. Holds at most ``size`` frames
    and ``max_bytes`` bytes of them (events may be large), oldest out first."""

    def __init__(self, size: int = 4096, max_bytes: int = 8 * 1024 * 1024) -> None:
        self._frames: OrderedDict[tuple[str, str, int, str, tuple[str, ...]], bytes] = OrderedDict()
        self._size = size
        self._max_bytes = max_bytes
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._frames)

    def frame(self, event: Event, view: tuple[str, ...] = ()) -> bytes:
        """The event's frame. ``view`` names the masks a reader's events carry
        (``Stream.view``): a masked frame is cached apart from the whole one,
        so it is never sent to a reader who may see the value. The event's id
        is in the key: a stream deleted and created again reuses its offsets."""
        key = (event.tenant, event.path, event.offset, event.id, view)
        frame = self._frames.get(key)
        if frame is None:
            record = event.to_dict()
            frame = b"id: %d\ndata: %s\n\n" % (event.offset, orjson.dumps(record))
            self._frames[key] = frame
            self.bytes += len(frame)
            while len(self._frames) > self._size or self.bytes > self._max_bytes:
                _, old = self._frames.popitem(last=False)
                self.bytes -= len(old)
        return frame


FRAMES = FrameCache()


def chunks(batch: list[Event], view: tuple[str, ...] = ()) -> Iterator[bytes]:
    """The frames of ``batch``, in order, in pieces of at most ``CHUNK``
    bytes (a frame larger than that is split; SSE does not mind where)."""
    pending: list[bytes] = []
    size = 0
    for event in batch:
        frame = FRAMES.frame(event, view)
        pending.append(frame)
        size += len(frame)
        if size >= CHUNK:
            data = b"".join(pending) if len(pending) > 1 else frame
            pending.clear()
            size = 0
            full = len(data) - len(data) % CHUNK
            for start in range(0, full, CHUNK):
                yield data[start : start + CHUNK]
            if full < len(data):  # the rest waits for the next frames
                pending.append(data[full:])
                size = len(data) - full
    if pending:
        yield b"".join(pending)


def encode_error(error: errors.YokeError) -> bytes:
    return b"event: error\ndata: %s\n\n" % orjson.dumps({"error": error.to_dict()})


def encode_closed(stream: Stream) -> bytes:
    return b"event: closed\ndata: %s\n\n" % orjson.dumps({"path": stream.path, "closed": True})


def encode_deleted(stream: Stream, exc: errors.StreamDeleted) -> bytes:
    return b"event: deleted\ndata: %s\n\n" % orjson.dumps(
        {"path": stream.path, "deleted": True, "stream_id": exc.details.get("stream_id")}
    )


async def resolve_cursor(stream: Stream, after: int | None, last_event_id: str | None) -> int:
    """``Last-Event-ID`` (a reconnect) wins over ``?after=``; the cursor is
    checked before the response starts, so a bad one is a plain 400/410:
    as for ``?after=``, a value that is not an offset (digits, below 2^63)
    is ``invalid_input``, an offset beyond the head ``invalid_cursor``."""
    cursor = after or 0
    if last_event_id:
        if not DIGITS_RE.fullmatch(last_event_id) or int(last_event_id) > MAX_OFFSET:
            raise errors.InvalidInput(
                "Last-Event-ID must be an offset: an integer in [0, 2^63)", field="Last-Event-ID"
            )
        cursor = int(last_event_id)
    await stream.read(after=cursor, limit=1)
    return cursor


class SseResponse(StreamingResponse):
    """An SSE response that calls ``free`` when it ends, however it ends
    (the client gone, the server stopping): a tail's place among the
    expensive ones (expensive_tails.py)."""

    def __init__(self, content: AsyncIterator[bytes], free: Callable[[], None] | None = None) -> None:
        super().__init__(content, media_type="text/event-stream", headers=HEADERS)
        self.free = free

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.free is not None:
                self.free()


def tail_response(
    stream: Stream,
    after: int,
    *,
    include_ephemeral: bool,
    heartbeat_s: float,
    shutdown: asyncio.Event,
    event_filter: Filter | None = None,
    free: Callable[[], None] | None = None,
) -> StreamingResponse:
    return SseResponse(_events(stream, after, include_ephemeral, heartbeat_s, shutdown, event_filter), free)


# Closes started by a client that went away: they run on (and record their
# end) after the response's task is cancelled.
_CLOSING: set[asyncio.Task[None]] = set()


async def connection_response(
    stream: Stream,
    connection_key: str,
    after: int | None,
    *,
    events: bool,
    include_ephemeral: bool,
    heartbeat_s: float,
    shutdown: asyncio.Event,
    event_filter: Filter | None = None,
    free: Callable[[], None] | None = None,
) -> StreamingResponse:
    """A session connection over SSE. It opens before the answer starts
    (bad input is a plain 4xx); the client reading slowly holds the
    connection back (one batch is buffered), and going away closes it."""
    queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=1)
    try:
        connection = await stream.open_connection(
            connection_key=connection_key, on_batch=queue.put, replay_after=after, filter=event_filter,
            events=events, include_ephemeral=include_ephemeral,
        )
    except BaseException:
        if free is not None:
            free()
        raise
    return SseResponse(_connection_frames(connection, queue, heartbeat_s, shutdown), free)


def _connection_chunks(batch: Any) -> Iterator[bytes]:
    if isinstance(batch, dict):  # events=False: a state update
        yield b"event: state\ndata: %s\n\n" % orjson.dumps(batch)
    else:
        yield from chunks(batch)


async def _connection_frames(
    connection: Connection, queue: asyncio.Queue[Any], heartbeat_s: float, shutdown: asyncio.Event
) -> AsyncIterator[bytes]:
    ended = asyncio.ensure_future(connection.wait())
    stopping = asyncio.ensure_future(shutdown.wait())
    metrics.OPEN_TAILS.inc()
    try:
        yield b"event: opened\ndata: %s\n\n" % orjson.dumps(
            {"connection_id": connection.id, "connection_key": connection.key, "after": connection.after}
        )
        while True:
            get = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait(
                {get, ended, stopping}, timeout=heartbeat_s, return_when=asyncio.FIRST_COMPLETED
            )
            if get in done:
                for chunk in _connection_chunks(get.result()):
                    yield chunk
                continue
            get.cancel()
            if stopping in done and not ended.done():
                await connection.close("shutdown")
            if ended.done() or stopping in done:
                while not queue.empty():  # what the connection delivered before it ended
                    for chunk in _connection_chunks(queue.get_nowait()):
                        yield chunk
                end: dict[str, Any] = {"reason": connection.reason}
                if connection.error is not None:
                    end["error"] = connection.error.to_dict()
                yield b"event: ended\ndata: %s\n\n" % orjson.dumps(end)
                return
            yield b": ping\n\n"
    finally:
        metrics.OPEN_TAILS.dec()
        ended.cancel()
        stopping.cancel()
        if not connection.closed:  # the client went away
            task = asyncio.ensure_future(connection.close("disconnected"))
            _CLOSING.add(task)
            task.add_done_callback(_CLOSING.discard)


async def _events(
    stream: Stream, after: int, include_ephemeral: bool, heartbeat_s: float, shutdown: asyncio.Event,
    event_filter: Filter | None,
) -> AsyncIterator[bytes]:
    batches = follow(
        stream,
        after,
        include_ephemeral=include_ephemeral,
        sweep_s=stream.kernel.tail_sweep_s,
        idle_s=heartbeat_s,
        stop=shutdown,
        event_filter=event_filter,
    )
    metrics.OPEN_TAILS.inc()
    OPEN_TAILS[stream.tenant] += 1
    try:
        yield b": tailing\n\n"
        try:
            async for batch in batches:
                if not batch:
                    yield b": ping\n\n"
                for chunk in chunks(batch, stream.view):  # masked by the tail for this reader
                    yield chunk
        except errors.StreamDeleted as exc:
            yield encode_deleted(stream, exc)
        except errors.YokeError as exc:  # cursor_gone, runtime_closed, filter_failed
            yield encode_error(exc)
        else:
            if not shutdown.is_set():  # follow ended: the stream is closed and read through
                yield encode_closed(stream)
    finally:
        metrics.OPEN_TAILS.dec()
        OPEN_TAILS[stream.tenant] -= 1
        if not OPEN_TAILS[stream.tenant]:
            del OPEN_TAILS[stream.tenant]
        await batches.aclose()
