"""The HTTP/1.1 connection protocol ``yoke serve`` runs.

uvicorn's httptools protocol, with the edges of a connection that no route
sees (docs/reference/http.md, "Connections"):

- a head deadline: the request line and headers must arrive within
  ``http_header_timeout_s`` of the connection opening (or, on a kept-alive
  connection, of the next request's first byte; the idle wait before it is
  uvicorn's ``http_keep_alive_s``). uvicorn has none: a client that sends
  half a head, or nothing, held its connection forever;
- a body deadline: the whole body must arrive within ``http_body_timeout_s``
  of the end of the head, whether or not the route reads it;
- a cap on concurrent connections per server process
  (``http_max_connections``), SSE tails included, and optionally per client
  address (``http_max_connections_per_client``): a connection takes a slot
  when its first request head arrives and the slot is free, and keeps it
  until it closes; past the cap the request is answered 503
  ``too_many_connections`` (with ``Retry-After``) and the connection closed.
  ``/healthz``, ``/readyz`` and ``/metrics`` are answered past the cap
  (without a slot, and the connection closed after), so that a liveness
  probe never restarts a server because clients filled it;
- an answer given before its request's body has arrived (a 401 for a
  wrong token, say) closes the connection after it (``Connection: close``),
  gently: the client's remaining body is read and dropped for at most
  ``LINGER_S`` so that the close does not reset the connection under an
  answer the client has not read yet. A trickling body cannot keep a slot;
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

import httptools
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
    max_connections_per_client: int = 0  # 0: no cap per client address

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "max_connections", "max_head_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"http_{name} must be a positive number, not {value!r}")
        value = self.max_connections_per_client
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"http_max_connections_per_client must be 0 (no cap) or more, not {value!r}")


async def too_many_connections(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI app a connection past the cap gets: 503, then the connection closes."""
    response = error_response(
        errors.TooManyConnections("the server holds as many connections as it allows", retry_after=1)
    )
    response.headers["connection"] = "close"
    await response(scope, receive, send)


# Served past the cap (never refused for it): health checks and metrics.
UNCAPPED_PATHS = frozenset({b"/healthz", b"/readyz", b"/metrics"})
# How long the rest of a body is read (and dropped) after an answer that
# came before it, before the connection is closed.
LINGER_S = 2.0


class Slots:
    """The connections of one server that hold a slot of the cap, in all and
    per client address."""

    def __init__(self) -> None:
        self.total = 0
        self.by_client: dict[str, int] = {}

    def take(self, client: str) -> None:
        self.total += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1

    def give_back(self, client: str) -> None:
        self.total -= 1
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]


class _AnswerTransport:
    """The transport a request's cycle writes its answer to. uvicorn closes
    it right after an answer sent with ``Connection: close``; when the
    request's body is still arriving, that close lingers (``_close_after_answer``)."""

    __slots__ = ("_protocol", "_transport")

    def __init__(self, protocol: YokeHttpProtocol, transport: asyncio.Transport) -> None:
        self._protocol = protocol
        self._transport = transport

    def write(self, data: bytes) -> None:
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._protocol._close_after_answer()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a request refused whole."""


class YokeHttpProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    slots: ClassVar[Slots] = Slots()  # protocol_class gives each server its own

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._linger_timer: asyncio.TimerHandle | None = None
        self._reading_head = True  # between requests, or in a request's head
        self._head_bytes = 0  # bytes of the current head so far (and what came with them)
        self._line_done = False  # the current head's request line is complete
        self._refusal: tuple[errors.YokeError, str] | None = None  # why a callback stopped the parser
        self._slot: str | None = None  # the client address whose slot this connection holds
        self._keep_alive = True  # what the current request's cycle gets once its body is in
        self._lingering = False  # answered; the rest of the body is dropped until the close

    # --- connection ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        if self._slot is not None:
            self.slots.give_back(self._slot)
            self._slot = None
        super().connection_lost(exc)

    def shutdown(self) -> None:
        self._keep_alive = False  # also once the current request's body is in
        super().shutdown()

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._linger_timer = None

    def _admit(self, target: bytes) -> tuple[bool, bool]:
        """Whether the request for ``target`` is served, and whether its
        connection closes after the answer. A connection takes a slot with
        its first request served under the cap and keeps it; past the cap,
        the uncapped paths are served without one (then closed), the rest
        refused."""
        if self._slot is not None:
            return True, False
        client = self.client[0] if self.client else ""
        per_client = self.limits.max_connections_per_client
        if self.slots.total < self.limits.max_connections and (
            not per_client or self.slots.by_client.get(client, 0) < per_client
        ):
            self.slots.take(client)
            self._slot = client
            return True, False
        try:
            path = httptools.parse_url(target).path  # origin-form or absolute-form
        except httptools.HttpParserInvalidURLError:
            path = b""
        if path in UNCAPPED_PATHS:
            return True, True
        metrics.HTTP_REFUSED.labels("too_many_connections").inc()
        return False, True

    # --- the head ------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._lingering:  # the rest of a body that was answered: dropped
            return
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
        served, close = self._admit(self.url)
        earlier, app = self.cycle, self.app
        if not served:
            self.app = too_many_connections  # this request's app (uvicorn reads self.app here)
        try:
            super().on_headers_complete()
        finally:
            self.app = app
        cycle = self.cycle
        if cycle is None or cycle is earlier:  # no request cycle started (an upgrade)
            return
        cycle.transport = _AnswerTransport(self, self.transport)  # type: ignore[assignment]
        # Until the body has arrived, an answer closes the connection after
        # it: uvicorn sends "connection: close" for a cycle without keep-alive.
        self._keep_alive = cycle.keep_alive and not close
        cycle.keep_alive = False

    def on_message_complete(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        self._reading_head = True
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.keep_alive = self._keep_alive  # the body is in: the answer may keep the connection
        super().on_message_complete()

    def _close_after_answer(self) -> None:
        """uvicorn closes after an answer with "connection: close". If the
        request's body is still arriving, closing now would make the kernel
        reset the connection as the next bytes come, which may discard the
        answer before the client reads it: end the sending side instead,
        drop what still comes, and close after ``LINGER_S`` (or when the
        client closes): the staged close of RFC 9112, section 9.6."""
        transport = self.transport
        if transport.is_closing():
            return
        if self._reading_head or not transport.can_write_eof():  # the body is in: close
            transport.close()
            return
        self._lingering = True
        self._cancel_timers()  # the body deadline: the body is dropped now
        transport.write_eof()
        self._linger_timer = self.loop.call_later(min(LINGER_S, self.limits.body_timeout_s), transport.close)

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
        self._cancel_timers()
        if self._reading_head and self.transport.can_write_eof():
            # The rest of the head may still be arriving: a close now would
            # reset the connection as it comes, and may discard the answer
            # before the client reads it. Stage the close, as after an answer.
            self._lingering = True
            self.transport.write_eof()
            self._linger_timer = self.loop.call_later(
                min(LINGER_S, self.limits.body_timeout_s), self.transport.close
            )
            return
        self.transport.close()


def protocol_class(limits: ConnectionLimits) -> type[YokeHttpProtocol]:
    """The protocol class to give uvicorn (``Config(http=...)``) for ``limits``."""
    return type("YokeHttpProtocol", (YokeHttpProtocol,), {"limits": limits, "slots": Slots()})
