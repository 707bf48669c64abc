"""The HTTP/1.1 connection protocol ``yoke serve`` runs.

uvicorn's httptools protocol, with the edges of a connection that no route
sees (docs/http.md, "Connections"):

- a head deadline: the request line and headers must arrive within
  ``http_header_timeout_s`` of the connection opening (or, on a kept-alive
  connection, of the next request's first byte; the idle wait before it is
  uvicorn's ``http_keep_alive_s``). uvicorn has none: a client that sends
  half a head, or nothing, held its connection forever;
- a body deadline: the whole body must arrive within ``http_body_timeout_s``
  of the end of the head, whether or not the route reads it;
- a cap on concurrent connections per server process
  (``http_max_connections``), SSE tails included: a connection past it is
  answered 503 ``too_many_connections`` (with ``Retry-After``) once its
  request head arrives, then closed;
- a cap on the request head (``http_max_head_bytes``): 414 ``uri_too_long``
  while the request line is still arriving, 431 ``headers_too_large`` after;
- a malformed request is 400 ``malformed_request``.

Each of these answers is the API's JSON error body and closes the
connection; a deadline that passes before any byte of a request arrived
closes it without an answer. uvicorn answers some of them in plain text.
A request refused while the answer to an earlier one on the connection is
still being written (a tail, with a pipelined head behind it) closes the
connection without an answer: bytes written then would land in the middle
of that answer (an SSE body, say) and be taken as part of it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from .. import errors, metrics
from .responses import error_response

log = logging.getLogger("yoke.http")


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 1000
    max_head_bytes: int = 32 * 1024

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "max_connections", "max_head_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"http_{name} must be a positive number, not {value!r}")


async def too_many_connections(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI app a connection past the cap gets: 503, then the connection closes."""
    response = error_response(
        errors.TooManyConnections("the server holds as many connections as it allows", retry_after=1)
    )
    response.headers["connection"] = "close"
    await response(scope, receive, send)


class HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a request refused whole."""


class YokeHttpProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._reading_head = True  # between requests, or in a request's head
        self._head_bytes = 0  # bytes of the current head so far (and what came with them)
        self._line_done = False  # the current head's request line is complete
        self._refusal: tuple[errors.YokeError, str] | None = None  # why a callback stopped the parser

    # --- connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            metrics.HTTP_REFUSED.labels("too_many_connections").inc()
            self.app = too_many_connections  # answers its request (once its head is in)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    # --- the head ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._reading_head:
            if self._head_timer is None:  # the first byte of a kept-alive connection's next request
                self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)
            self._head_bytes += len(data)
            if not self._line_done and b"\n" in data:
                self._line_done = True
        super().data_received(data)
        # A head still arriving past the limit (one that arrived whole was
        # measured in on_headers_complete).
        if self._reading_head and self._head_bytes > self.limits.max_head_bytes and not self.transport.is_closing():
            self._refuse(*self._too_large(line=not self._line_done))

    def _too_large(self, *, line: bool) -> tuple[errors.YokeError, str]:
        limit = self.limits.max_head_bytes
        if line:
            return errors.UriTooLong(f"the request line is at most {limit} bytes", limit=limit), "uri_too_long"
        return errors.HeadersTooLarge(f"the request head is at most {limit} bytes", limit=limit), "headers_too_large"

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A request that began in the same read as the previous one's end
        # (pipelined) started no timer in data_received: its deadline starts here.
        self._head_bytes = max(self._head_bytes, 1)
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def on_headers_complete(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        line = len(self.url) + len(self.parser.get_method()) + 11  # "GET " url " HTTP/1.1\r\n"
        size = line + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.limits.max_head_bytes:
            # Stops the parser (no request starts); uvicorn then calls send_400_response.
            self._refusal = self._too_large(line=line > self.limits.max_head_bytes)
            raise HeadRefused
        self._reading_head = False
        self._head_bytes = 0
        self._line_done = False
        self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._reading_head = True
        super().on_message_complete()

    def _answering(self) -> bool:
        """The answer to an earlier request on this connection is still being
        written (or awaited): an answer to the next one may not start."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        metrics.HTTP_REFUSED.labels("head_timeout").inc()
        if self._head_bytes == 0:  # nothing of a request arrived: nothing to answer
            self.transport.close()
            return
        self._refuse(errors.RequestTimeout(
            f"the request head did not arrive within {self.limits.header_timeout_s:g} s",
            timeout_s=self.limits.header_timeout_s,
        ), None)

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        metrics.HTTP_REFUSED.labels("body_timeout").inc()
        cycle = self.cycle
        # The route answered without the body, or it never started: the
        # request was pipelined behind one whose answer is still being written.
        if cycle is None or cycle.response_started or self.pipeline:
            self.transport.close()
            return
        # The route is still waiting for the body: answer for it, and from
        # now on it sees a disconnected client (its own answer goes nowhere).
        cycle.disconnected = True
        cycle.message_event.set()
        self._refuse(errors.RequestTimeout(
            f"the request body did not arrive within {self.limits.body_timeout_s:g} s",
            timeout_s=self.limits.body_timeout_s,
        ), None, own=True)

    # --- answers written here ------------------------------------------------------

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this for what its parser refuses (plain text there),
        and after a callback of ours stopped the parser (``_refusal``)."""
        refusal, self._refusal = self._refusal, None
        if refusal is None:
            refusal = errors.MalformedRequest(f"the request is not valid HTTP/1.1 ({msg.rstrip('.')})"), "malformed"
        # A malformed body: the answer is for the request being read, if its
        # route has not started one (and none is queued ahead of it).
        cycle = self.cycle
        own = not self._reading_head and cycle is not None and not cycle.response_started and not self.pipeline
        self._refuse(*refusal, own=own)

    def _refuse(self, error: errors.YokeError, reason: str | None, *, own: bool = False) -> None:
        """Write ``error`` as the API's JSON error answer and close the
        connection; only close it while an earlier request's answer is still
        being written (``own``: the answer is for ``self.cycle``, whose route
        has not answered)."""
        if self.transport.is_closing():
            return
        if reason is not None:
            metrics.HTTP_REFUSED.labels(reason).inc()
        if not own and self._answering():
            log.warning("%s while answering an earlier request: connection closed (%s)", error.code, error.message)
            self.transport.close()
            self._cancel_timers()
            return
        log.warning("%s: %s", error.code, error.message)
        body = orjson.dumps({"error": error.to_dict()})
        head = [STATUS_LINE[error.http_status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
        self._cancel_timers()


def protocol_class(limits: ConnectionLimits) -> type[YokeHttpProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for ``limits``."""
    return type("YokeHttpProtocol", (YokeHttpProtocol,), {"limits": limits})
