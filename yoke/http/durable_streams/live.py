"""SSE reads (``live=sse``): ``data`` events with the messages (base64 for
byte streams other than text), each followed by a ``control`` event with the
next offset, the cursor, ``upToDate``, and ``streamClosed`` at the end of a
closed stream, which ends the response. An idle connection gets a control
event every ``protocol_long_poll_s``; the server ends the response after
``protocol_sse_max_s`` (the client reconnects from the last offset)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import re
from typing import TYPE_CHECKING, Any

import orjson

from ...store.durable_streams import ProtocolStream
from . import offsets
from .messages import is_text, read_page

if TYPE_CHECKING:
    from .routes import DurableStreams, Request

LINE_BREAK = re.compile(rb"\r\n|\r|\n")
log = logging.getLogger("yoke.http.durable_streams")


def frame(kind: bytes, data: bytes) -> bytes:
    """One SSE event; every line of ``data`` on its own ``data:`` line (no
    space after the colon: a client strips one, and data may start with one)."""
    lines = LINE_BREAK.split(data)
    return b"event: " + kind + b"\n" + b"".join(b"data:" + line + b"\n" for line in lines) + b"\n"


async def sse(
    server: DurableStreams, request: Request, send: Any, stream: ProtocolStream, tenant: str, after: int,
    client_cursor: str | None,
) -> None:
    from .routes import COMMON

    runtime = server.runtime
    settings, clock = runtime.settings, runtime.clock
    encode = not is_text(stream.content_type)
    headers = list(COMMON) + [
        (b"content-type", b"text/event-stream"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]
    if encode:
        headers.append((b"stream-sse-data-encoding", b"base64"))
    waiter = runtime.hub.subscribe(tenant, stream.path)
    shutdown = getattr(server.state, "shutdown", None)
    ends_at = clock.monotonic() + settings.protocol_sse_max_s
    gone = asyncio.Event()

    async def watch() -> None:  # the client going away ends the loop
        while (await request.receive())["type"] != "http.disconnect":
            pass
        gone.set()
        waiter.wake()

    watcher = asyncio.create_task(watch())
    try:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        idle_since = clock.monotonic()
        first = True
        while not gone.is_set():
            page = await read_page(runtime.store, tenant, stream.path, after, stream.content_type)
            if not page.exists:
                return
            out = bytearray()
            if page.last is not None:
                out += frame(b"data", base64.b64encode(page.body) if encode else page.body)
                after = page.last
            up_to_date = after >= page.head
            control: dict[str, Any] = {"streamNextOffset": offsets.token(after)}
            if up_to_date and page.closed:
                control["streamClosed"] = True
                control["upToDate"] = True
            else:
                control["streamCursor"] = offsets.cursor(client_cursor, clock.wall())
                if up_to_date:
                    control["upToDate"] = True
            now = clock.monotonic()
            if page.last is not None or "streamClosed" in control or first \
                    or now - idle_since >= settings.protocol_long_poll_s:
                out += frame(b"control", orjson.dumps(control))
                idle_since = now
                first = False
            if out:
                await send({"type": "http.response.body", "body": bytes(out), "more_body": True})
            if "streamClosed" in control or now >= ends_at or (shutdown is not None and shutdown.is_set()):
                return
            if up_to_date:
                with contextlib.suppress(TimeoutError):
                    timeout = min(settings.tail_sweep_s, max(0.01, ends_at - now))
                    async with asyncio.timeout(timeout):
                        await waiter.wait()
    except Exception:
        # The answer has begun: it can only end (below), not become a 500.
        log.exception("durable streams SSE of %s failed", stream.path)
    finally:
        watcher.cancel()
        waiter.close()
        with contextlib.suppress(Exception):
            await send({"type": "http.response.body", "body": b"", "more_body": False})
