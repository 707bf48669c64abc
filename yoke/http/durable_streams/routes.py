"""The Durable Streams protocol under ``/v1/stream/{name}``.

A raw ASGI layer in front of FastAPI (like the append hot path): PUT
creates, POST appends (or closes), GET reads (catch-up, long-poll, SSE),
HEAD describes, DELETE deletes, OPTIONS answers CORS preflights. Stream
``{name}`` is Yoke stream ``/{name}`` of the caller's tenant; every append
goes through the group-commit appender (``AppendService.append_protocol``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from ... import errors
from ...events import PreparedEvent, validate_path
from ...store.durable_streams import CreateSpec, Guard, ProtocolStream
from ...store.durable_stream_forks import base_type
from ...streams.append import GuardedAppend
from ...streams.protocol_streams import ProtocolStreams
from ...streams.rules import APPEND, READ, Caller
from ..auth import Principal, authorize, bearer_token
from ..fast_append import read_body
from ..responses import error_body
from . import offsets
from .remembered import KnownStreams
from .live import sse
from .messages import Page, events_of, is_json, read_page

log = logging.getLogger("yoke.http.durable_streams")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

PREFIX = "/v1/stream/"
# A stream's Content-Type is stored and sent with every answer: bounded.
MAX_CONTENT_TYPE = 256

ALLOW_HEADERS = (
    "content-type, authorization, Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, Producer-Id,"
    " Producer-Epoch, Producer-Seq, Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset,"
    " If-None-Match"
)
EXPOSE_HEADERS = (
    "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, Stream-TTL, Stream-Expires-At,"
    " Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, ETag, Content-Type,"
    " Location, stream-sse-data-encoding"
)
COMMON = [
    (b"x-content-type-options", b"nosniff"),
    (b"cross-origin-resource-policy", b"cross-origin"),
    (b"access-control-allow-origin", b"*"),
    (b"access-control-expose-headers", EXPOSE_HEADERS.encode()),
]
CACHE_READ = "private, max-age=60, stale-while-revalidate=300"


class Answer:
    """A response: status, headers, body."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.status = status
        self.headers = headers or {}
        self.body = body

    async def send(self, send: Any, head_only: bool = False) -> None:
        headers = list(COMMON)
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        if self.status not in (204, 304):
            headers.append((b"content-length", str(len(self.body)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        body = b"" if head_only or self.status in (204, 304) else self.body
        await send({"type": "http.response.body", "body": body})


def failure(exc: errors.YokeError, headers: dict[str, str] | None = None) -> Answer:
    body = error_body(exc)
    extra = {"content-type": "application/json", **(headers or {})}
    if "retry_after" in exc.details:
        extra["retry-after"] = str(exc.details["retry_after"])
    if exc.http_status == 401:
        extra["www-authenticate"] = "Bearer"
    return Answer(exc.http_status, extra, body)


class Request:
    __slots__ = ("scope", "receive", "headers", "query", "name", "path")

    def __init__(self, scope: Scope, receive: Any, name: str) -> None:
        self.scope = scope
        self.receive = receive
        self.headers: dict[str, str] = {}
        for key, value in scope["headers"]:
            self.headers.setdefault(key.decode("latin-1").lower(), value.decode("latin-1"))
        self.query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        self.name = name
        self.path = "/" + name

    def arg(self, name: str) -> str | None:
        values = self.query.get(name)
        if values is None:
            return None
        if len(values) > 1:
            raise errors.InvalidInput(f"{name} given more than once", field=name)
        return values[0]

    def flag(self, name: str) -> bool:
        """Stream-Closed and the like: present only when exactly 'true' (any case)."""
        return self.headers.get(name, "").strip().lower() == "true"


class DurableStreams:
    """Answers ``/v1/stream/...``; everything else goes to ``app``."""

    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state
        self.known = KnownStreams()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(PREFIX):
            await self.app(scope, receive, send)
            return
        scope["route"] = _Route
        method = scope["method"]
        request = Request(scope, receive, scope["path"][len(PREFIX):])
        if method == "OPTIONS":
            await Answer(204, {
                "access-control-allow-methods": ALLOW,
                "access-control-allow-headers": ALLOW_HEADERS,
                "access-control-max-age": "86400",
            }).send(send)
            return
        try:
            handler = HANDLERS.get(method)
            if handler is None:
                answer = Answer(405, {"allow": ALLOW})
            else:
                try:
                    validate_path(request.path)
                except errors.YokeError as exc:
                    raise errors.InvalidPath(f"invalid stream name {request.name[:80]!r}") from exc
                if request.path == "/":  # the tenant's global stream: Yoke's own facts
                    raise errors.InvalidPath("a protocol stream needs a name: /v1/stream/{name}")
                answer = await handler(self, request, send)
        except errors.YokeError as exc:
            answer = failure(exc)
        except Exception:
            log.exception("durable streams %s %s failed", method, scope["path"])
            answer = Answer(500, {"content-type": "application/json"},
                            b'{"error":{"code":"internal_error","message":"internal error"}}')
        if answer is not None:
            await answer.send(send, head_only=method == "HEAD")

    # --- common -----------------------------------------------------------------

    @property
    def runtime(self) -> Any:
        return self.state.runtime

    async def principal(self, request: Request, scope: str) -> tuple[Principal, Caller]:
        """The token's principal, and the caller its streams are opened for: a
        generic one (the protocol can carry no data handling pins)."""
        token = bearer_token(request.headers.get("authorization"))
        principal = await authorize(self.state, token, request.arg("tenant"), scope)
        return principal, Caller.generic(principal.scopes, principal.token_id)

    @property
    def streams(self) -> ProtocolStreams:
        return self.runtime.protocol_streams

    # --- DELETE ----------------------------------------------------------------------

    async def delete(self, request: Request, send: Any) -> Answer:
        principal, caller = await self.principal(request, "admin")
        self.known.forget(principal.tenant, request.path)
        for path in await self.streams.delete(principal.tenant, request.path, caller):
            self.known.forget(principal.tenant, path)
        return Answer(204)

    # --- PUT: create ------------------------------------------------------------

    async def create(self, request: Request, send: Any) -> Answer:
        principal, caller = await self.principal(request, "append")
        h = request.headers
        fork_of = h.get("stream-forked-from")
        content_type = h.get("content-type", "").strip() or None
        if content_type is not None and len(content_type) > MAX_CONTENT_TYPE:
            raise errors.InvalidInput(f"Content-Type is longer than {MAX_CONTENT_TYPE} characters",
                                      field="Content-Type")
        if content_type is not None and "/" not in content_type:
            content_type = None
        if content_type is None and fork_of is None:
            content_type = "application/octet-stream"
        ttl_raw, expires_raw = h.get("stream-ttl"), h.get("stream-expires-at")
        if ttl_raw is not None and expires_raw is not None:
            raise errors.InvalidInput("give Stream-TTL or Stream-Expires-At, not both", field="Stream-TTL")
        ttl_s = offsets.parse_decimal(ttl_raw, "Stream-TTL") if ttl_raw is not None else None
        expires_ms = offsets.parse_expires_at(expires_raw) if expires_raw is not None else None
        fork_offset = fork_sub = None
        if fork_of is not None:
            fork_of = fork_of.strip()
            if fork_of.startswith(PREFIX):
                fork_of = fork_of[len(PREFIX) - 1:]
            elif not fork_of.startswith("/"):
                fork_of = "/" + fork_of
            validate_path(fork_of)
            if fork_of == "/":
                raise errors.InvalidInput("Stream-Forked-From needs a stream name", field="Stream-Forked-From")
            if "stream-fork-offset" in h:
                fork_offset = offsets.parse_token(h["stream-fork-offset"].strip(), "Stream-Fork-Offset")
        elif "stream-fork-offset" in h:
            raise errors.InvalidInput("Stream-Fork-Offset needs Stream-Forked-From", field="Stream-Fork-Offset")
        if "stream-fork-sub-offset" in h:
            if fork_of is None:
                raise errors.InvalidInput("Stream-Fork-Sub-Offset needs Stream-Forked-From", field="Stream-Fork-Sub-Offset")
            fork_sub = offsets.parse_decimal(h["stream-fork-sub-offset"].strip(), "Stream-Fork-Sub-Offset")
        closed = request.flag("stream-closed")
        body = await read_body(request.receive, self.limit)
        kind = content_type
        existing = await self.streams.existing(principal.tenant, request.path, caller)
        if existing is not None and existing.deleted:
            raise errors.StreamExists(f"stream {request.path} was deleted; forks of it live on", path=request.path)
        if existing is not None:
            return self._idempotent(existing, content_type, ttl_s, expires_raw, closed, fork_of, fork_offset,
                                    fork_sub or 0)
        if fork_of is not None and kind is None:
            source = await self.streams.fork_source(principal.tenant, fork_of, caller)
            kind = source.content_type if source is not None else "application/octet-stream"
        events = events_of(body, kind or "application/octet-stream", creating=True) if body else []
        spec = CreateSpec(
            content_type=content_type, ttl_s=ttl_s, expires_at=expires_raw, expires_ms=expires_ms,
            closed=closed, events=events, fork_of=fork_of, fork_offset=fork_offset, fork_sub=fork_sub or 0,
        )
        stream, created = await self.streams.create(principal.tenant, request.path, caller, spec)
        if not created:
            return self._idempotent(stream, content_type, ttl_s, expires_raw, closed, fork_of, fork_offset,
                                    fork_sub or 0)
        headers = {
            "content-type": stream.content_type,
            "stream-next-offset": offsets.token(stream.head),
            "location": _url(request),
        }
        if stream.closed:
            headers["stream-closed"] = "true"
        return Answer(201, headers)

    @staticmethod
    def _idempotent(
        stream: ProtocolStream, content_type: str | None, ttl_s: int | None, expires_at: str | None,
        closed: bool, fork_of: str | None, fork_offset: int | None, fork_sub: int,
    ) -> Answer:
        same = (
            (content_type is None or base_type(content_type) == base_type(stream.content_type))
            and (fork_of is not None or (ttl_s == stream.ttl_s and expires_at == stream.expires_at))
            and closed == stream.closed
            and fork_of == stream.fork_of
            and (fork_offset is None or fork_offset == stream.fork_offset)
            and fork_sub == stream.fork_sub
        )
        if not same:
            raise errors.StreamExists(f"stream {stream.path} exists with another configuration")
        headers = {"content-type": stream.content_type, "stream-next-offset": offsets.token(stream.head)}
        if stream.closed:
            headers["stream-closed"] = "true"
        return Answer(200, headers)

    @property
    def limit(self) -> int:
        return self.runtime.settings.protocol_max_body_bytes

    # --- POST: append, close ------------------------------------------------------

    async def append(self, request: Request, send: Any) -> Answer:
        principal, caller = await self.principal(request, "append")
        h = request.headers
        producer = None
        named = [k for k in ("producer-id", "producer-epoch", "producer-seq") if k in h]
        if named:
            if len(named) != 3:
                raise errors.InvalidInput("Producer-Id, Producer-Epoch and Producer-Seq go together", field="Producer-Id")
            if not h["producer-id"]:
                raise errors.InvalidInput("Producer-Id must not be empty", field="Producer-Id")
            producer = (
                h["producer-id"],
                offsets.parse_decimal(h["producer-epoch"].strip(), "Producer-Epoch", offsets.MAX_SAFE),
                offsets.parse_decimal(h["producer-seq"].strip(), "Producer-Seq", offsets.MAX_SAFE),
            )
        close = request.flag("stream-closed")
        stream_seq = h.get("stream-seq")
        body = await read_body(request.receive, self.limit)
        tenant = principal.tenant
        # A remembered stream was admitted for this (generic) surface when it
        # was looked up: its pins are fixed for its lifetime, and the append
        # carries that lifetime (another one at the path is "gone").
        stream = self.known.get(tenant, request.path)
        for _ in range(3):  # a remembered stream may be out of date: look again
            fresh = stream is None
            if stream is None:
                # Its TTL window restarts once the append is done (below): a
                # slow commit must not eat into the window the client counts.
                stream = await self.streams.lookup(tenant, request.path, caller, APPEND, touch=False)
                self.known.remember(tenant, stream)
            try:
                events = _events_to_append(stream, h, body, close, producer is not None)
            except errors.YokeError:
                if fresh:
                    raise
                self.known.forget(tenant, request.path)  # answered from the stream as it is now
                stream = None
                continue
            if isinstance(events, Answer):
                return events
            # With the lifetime the route looked up: a DELETE and a PUT in
            # between refuse the append as "gone" rather than take it into
            # the new stream.
            guard = Guard(producer, stream_seq, close, stream.stream_id)
            try:
                answer = await self.runtime.appends.append_protocol(tenant, request.path, events, guard)
            except errors.StreamClosed:
                self.known.forget(tenant, request.path)
                current = await self.runtime.store.protocol.stream(tenant, request.path)
                return _closed(current.head if current is not None else stream.head)
            except errors.StreamNotFound:
                self.known.forget(tenant, request.path)
                raise
            assert isinstance(answer, GuardedAppend)  # a guarded append's answer
            if answer.outcome.status != "gone":
                break
            self.known.forget(tenant, request.path)
            stream = None
        else:
            raise errors.StreamNotFound(f"stream {request.path} does not exist", path=request.path)
        if close:
            self.known.forget(tenant, request.path)
        await self.streams.touch(tenant, stream)
        outcome = answer.outcome
        head = answer.results[-1].offset if answer.results else answer.head
        headers = {"stream-next-offset": offsets.token(head)}
        if outcome.closed:
            headers["stream-closed"] = "true"
        status = outcome.status
        if status == "ok":
            if producer is not None:
                headers["producer-epoch"] = str(producer[1])
                headers["producer-seq"] = str(producer[2])
            return Answer(200 if producer is not None and events else 204, headers)
        if status == "duplicate":
            headers["producer-epoch"] = str(outcome.epoch)
            headers["producer-seq"] = str(outcome.last_seq)
            return Answer(204, headers)
        if status == "closed":
            return _closed(answer.head)
        if status == "stale_epoch":
            return failure(errors.Forbidden("a newer producer epoch is in use"), {"producer-epoch": str(outcome.epoch)})
        if status == "epoch_seq":
            raise errors.InvalidInput("a new producer epoch starts at Producer-Seq 0", field="Producer-Seq")
        if status == "seq_gap":
            return failure(SequenceGap("producer sequence gap"), {
                "producer-expected-seq": str(outcome.expected_seq),
                "producer-received-seq": str(outcome.received_seq),
            })
        return failure(SequenceGap("Stream-Seq must grow"))

    # --- HEAD -----------------------------------------------------------------------

    async def head(self, request: Request, send: Any) -> Answer:
        principal, caller = await self.principal(request, "read")
        stream = await self.streams.lookup(principal.tenant, request.path, caller, READ, touch=False)
        headers = {
            "content-type": stream.content_type,
            "stream-next-offset": offsets.token(stream.head),
            "cache-control": "no-store",
            "etag": _etag(stream, 0, stream.head, stream.closed),
        }
        if stream.closed:
            headers["stream-closed"] = "true"
        if stream.ttl_s is not None:
            headers["stream-ttl"] = str(stream.ttl_s)
        if stream.expires_at is not None:
            headers["stream-expires-at"] = stream.expires_at
        return Answer(200, headers)


    # --- GET: read ---------------------------------------------------------------------

    async def read(self, request: Request, send: Any) -> Answer | None:
        principal, caller = await self.principal(request, "read")
        live = request.arg("live")
        raw_offset = request.arg("offset")
        if raw_offset == "":
            raise errors.InvalidCursor("offset is empty", field="offset")
        offset = offsets.parse_offset(raw_offset)
        if live not in (None, "long-poll", "sse"):
            raise errors.InvalidInput("live is long-poll or sse", field="live")
        if live is not None and offset is None:
            raise errors.InvalidInput(f"{live} needs an offset", field="offset")
        client_cursor = request.arg("cursor")
        stream = await self.streams.lookup(principal.tenant, request.path, caller, READ)
        tenant, path = principal.tenant, request.path
        if raw_offset in (None, "-1"):
            # The beginning of the stream: of what retention kept of it (an
            # explicit offset before that is still 410).
            offset = stream.pruned_through
        if live == "sse":
            after = stream.head if offset == "now" else offset
            assert isinstance(after, int)
            await sse(self, request, send, stream, tenant, _checked(after, stream), client_cursor)
            return None
        if offset == "now" and live is None:
            headers = {
                "content-type": stream.content_type,
                "stream-next-offset": offsets.token(stream.head),
                "stream-up-to-date": "true",
                "cache-control": "no-store",
            }
            if stream.closed:
                headers["stream-closed"] = "true"
            return Answer(200, headers, b"[]" if is_json(stream.content_type) else b"")
        after = _checked(stream.head if offset == "now" else offset, stream)
        if live == "long-poll":
            answer = await self._long_poll(tenant, path, stream, after, client_cursor)
            await self.streams.touch(tenant, stream)  # its window starts again when it ends too
            return answer
        page = await read_page(self.runtime.store, tenant, path, after, stream.content_type)
        return self._page_answer(request, stream, after, page, None)

    def _page_answer(
        self, request: Request, stream: ProtocolStream, after: int, page: Page, client_cursor: str | None,
        live: bool = False,
    ) -> Answer:
        end = page.last if page.last is not None else max(after, page.head)
        up_to_date = end >= page.head
        at_end = up_to_date and page.closed
        headers = {
            "content-type": stream.content_type,
            "stream-next-offset": offsets.token(end),
            "etag": _etag(stream, after, end, at_end),
            "cache-control": CACHE_READ,
        }
        if up_to_date:
            headers["stream-up-to-date"] = "true"
        if at_end:
            headers["stream-closed"] = "true"
        if live and not at_end:
            headers["stream-cursor"] = offsets.cursor(client_cursor, self.runtime.clock.wall())
        if request.headers.get("if-none-match") == headers["etag"]:
            return Answer(304, {"etag": headers["etag"]})
        return Answer(200, headers, page.body)

    async def _long_poll(
        self, tenant: str, path: str, stream: ProtocolStream, after: int, client_cursor: str | None,
    ) -> Answer:
        runtime = self.runtime
        waiter = runtime.hub.subscribe(tenant, path)
        try:
            deadline = runtime.clock.monotonic() + runtime.settings.protocol_long_poll_s
            while True:
                page = await read_page(runtime.store, tenant, path, after, stream.content_type)
                if not page.exists:
                    raise errors.StreamNotFound(f"stream {path} does not exist", path=path)
                if page.last is not None:
                    return self._page_answer(_NO_REQUEST, stream, after, page, client_cursor, live=True)
                remaining = deadline - runtime.clock.monotonic()
                if page.closed or remaining <= 0:
                    headers = {
                        "stream-next-offset": offsets.token(max(after, page.head)),
                        "stream-up-to-date": "true",
                    }
                    if page.closed:
                        headers["stream-closed"] = "true"
                    else:
                        headers["stream-cursor"] = offsets.cursor(client_cursor, self.runtime.clock.wall())
                    return Answer(204, headers)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, runtime.settings.tail_sweep_s)):
                        await waiter.wait()
                if getattr(self.state, "shutdown", None) is not None and self.state.shutdown.is_set():
                    deadline = 0
        finally:
            waiter.close()


class SequenceGap(errors.YokeError):
    """The producer's sequence skipped ahead, or Stream-Seq did not grow."""

    code = "sequence_conflict"
    http_status = 409


class _NoRequest:
    headers: dict[str, str] = {}


_NO_REQUEST: Any = _NoRequest()


def _url(request: Request) -> str:
    host = request.headers.get("host") or "%s:%d" % tuple(request.scope.get("server") or ("127.0.0.1", 80))
    return f"{request.scope.get('scheme', 'http')}://{host}{request.scope['path']}"


def _checked(after: int, stream: ProtocolStream) -> int:
    if after > stream.head:
        raise errors.InvalidCursor("offset is beyond the stream's tail", field="offset")
    if after < stream.pruned_through:
        raise errors.CursorGone(
            "the messages after this offset were removed by retention", requested=after,
            earliest=stream.pruned_through + 1, latest=stream.head, reason="retention",
        )
    return after


def _events_to_append(
    stream: ProtocolStream, h: Any, body: bytes, close: bool, produced: bool
) -> list[PreparedEvent] | Answer:
    """The events a POST appends to ``stream``, or the answer refusing it."""
    if not body and not close:
        raise errors.InvalidInput("an append needs a body (or Stream-Closed: true)", field="body")
    if not body:
        return []
    if stream.closed and not produced:
        return _closed(stream.head)
    if "content-type" not in h:
        raise errors.InvalidInput("Content-Type is required", field="Content-Type")
    if not stream.closed and base_type(h["content-type"]) != base_type(stream.content_type):
        raise errors.StreamExists(f"this stream's content type is {stream.content_type}")
    return events_of(body, stream.content_type)


def _closed(head: int) -> Answer:
    return failure(errors.StreamClosed("the stream is closed"), {
        "stream-closed": "true", "stream-next-offset": offsets.token(head),
    })


def _etag(stream: ProtocolStream, start: int, end: int, closed: bool) -> str:
    return f'"{stream.stream_id}:{start}:{end}{":c" if closed else ""}"'


class _Route:
    """What the request metrics read from ``scope["route"]``."""

    path = "/v1/stream/{name:path}"


HANDLERS: dict[str, Callable[[DurableStreams, Request, Any], Awaitable[Answer | None]]] = {
    "PUT": DurableStreams.create,
    "POST": DurableStreams.append,
    "GET": DurableStreams.read,
    "HEAD": DurableStreams.head,
    "DELETE": DurableStreams.delete,
}
ALLOW = ", ".join([*HANDLERS, "OPTIONS"])
