"""A real HTTP webhook receiver for the subscription tests.

``WebhookReceiver`` listens on 127.0.0.1 (an ephemeral port) with a small
asyncio + h11 HTTP/1.1 server running in the test's own event loop, records
every request (headers, body, arrival time, the answer it got) and answers
with whatever ``respond(request)`` returns (sync or async: an async responder
can hold a request open until the test releases it). Tests wait on
``wait_for(predicate)``, a condition signalled on every request and answer.

``check_signed`` verifies one recorded request the way a receiver would: with
the reference Standard Webhooks implementation and with Yoke's own ``verify``.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from yoke.subscriptions import webhooks


@dataclass
class Request:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    received: float  # time.time() when the whole request had arrived
    status: int | None = None  # the answer (None while held or if the sender vanished)
    responded: float | None = None  # time.time() when the answer was written

    @property
    def json(self) -> dict[str, Any]:
        return orjson.loads(self.body)

    @property
    def msg_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def stream_id(self) -> str:
        return self.msg_id.rsplit(":", 1)[0]

    @property
    def offset(self) -> int:
        """The source offset, from the ``webhook-id`` header."""
        return int(self.msg_id.rsplit(":", 1)[1])

    @property
    def attempt(self) -> int:
        return self.json["attempt"]

    @property
    def event(self) -> dict[str, Any]:
        return self.json["event"]


@dataclass
class Response:
    status: int = 204
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


Responder = Callable[[Request], "Response | int | Awaitable[Response | int]"]


class WebhookReceiver:
    """``async with WebhookReceiver(respond) as hook: ... hook.url ...``"""

    def __init__(self, respond: Responder | None = None, *, path: str = "/hook") -> None:
        self.respond: Responder = respond or (lambda request: Response(204))
        self.requests: list[Request] = []
        self._path = path
        self._changed = asyncio.Condition()
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.connections = 0  # TCP connections accepted so far
        self.url = ""

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}{self._path}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            try:
                await task
            except BaseException:  # noqa: BLE001 - cancelled or a dead peer
                pass
        await self._server.wait_closed()

    # --- what tests use -------------------------------------------------------------

    def offsets(self) -> list[int]:
        """The offsets POSTed, in arrival order (redeliveries included)."""
        return [r.offset for r in self.requests]

    def for_offset(self, offset: int) -> list[Request]:
        return [r for r in self.requests if r.offset == offset]

    async def wait_for(self, predicate: Callable[[list[Request]], Any], timeout_s: float = 10.0) -> Any:
        """Wait until ``predicate(requests)`` is truthy (checked on every
        request and every answer) and return its value."""
        async with self._changed:
            try:
                async with asyncio.timeout(timeout_s):
                    while True:
                        value = predicate(self.requests)
                        if value:
                            return value
                        await self._changed.wait()
            except TimeoutError:
                raise AssertionError(
                    f"receiver condition not met within {timeout_s}s; offsets seen: {self.offsets()}"
                ) from None

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # --- the HTTP server ------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        head: h11.Request | None = None
        body = bytearray()
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                    continue
                if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
                if isinstance(event, h11.Request):
                    head, body = event, bytearray()
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    assert head is not None
                    request = Request(
                        method=head.method.decode(),
                        target=head.target.decode(),
                        headers={k.decode().lower(): v.decode() for k, v in head.headers},
                        body=bytes(body),
                        received=time.time(),
                    )
                    self.requests.append(request)
                    await self._notify()
                    answer = self.respond(request)
                    if inspect.isawaitable(answer):
                        answer = await answer
                    if isinstance(answer, int):
                        answer = Response(answer)
                    headers = [*answer.headers, ("content-length", str(len(answer.body)))]
                    writer.write(conn.send(h11.Response(status_code=answer.status, headers=headers)))
                    if answer.body:
                        writer.write(conn.send(h11.Data(data=answer.body)))
                    writer.write(conn.send(h11.EndOfMessage()))
                    await writer.drain()
                    request.status, request.responded = answer.status, time.time()
                    await self._notify()
                    if conn.our_state is h11.MUST_CLOSE:
                        return
                    conn.start_next_cycle()
        except (ConnectionError, h11.ProtocolError):
            return  # the sender went away (killed, timed out, closed its pool)
        finally:
            self._connections.discard(task)
            writer.close()


def check_signed(request: Request, secret: str, stream_id: str, path: str, name: str) -> dict[str, Any]:
    """Assert that ``request`` is one signed Standard Webhooks POST of one
    event of ``path``; return its parsed body."""
    assert request.method == "POST"
    assert request.headers["content-type"].startswith("application/json")
    # The reference implementation (raises WebhookVerificationError) ...
    body = Webhook(secret).verify(request.body, request.headers)
    # ... and Yoke's own receiver-side helper (raises ValueError).
    webhooks.verify(secret, request.headers, request.body)
    assert abs(int(request.headers["webhook-timestamp"]) - request.received) < 60
    # Signed with this secret, not merely well-formed: another key fails.
    other = "whsec_" + "QUJD" * 8
    try:
        Webhook(other).verify(request.body, request.headers)
    except WebhookVerificationError:
        pass
    else:
        raise AssertionError("a signature verified under an unrelated secret")
    assert set(body) == {"attempt", "event", "path", "name", "stream_id", "stream_created_at", "generation"}, body
    event = body["event"]
    assert isinstance(event, dict) and isinstance(event["offset"], int)  # one event, not a list
    assert request.headers["webhook-id"] == f"{stream_id}:{event['offset']}"
    # The run that sent it, in the signed body and in headers.
    assert body["stream_id"] == stream_id == request.headers["yoke-stream-id"]
    assert isinstance(body["stream_created_at"], int) and body["stream_created_at"] > 0
    assert request.headers["yoke-stream-created-at"] == str(body["stream_created_at"])
    assert isinstance(body["generation"], int) and request.headers["yoke-generation"] == str(body["generation"])
    assert body["path"] == path and body["name"] == name
    assert isinstance(body["attempt"], int) and body["attempt"] >= 1
    return body


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout_s: float = 10.0, what: str = "condition"
) -> Any:
    """Poll an async ``check`` (every 10 ms) until it returns something
    truthy; return it. For state only the store shows (a subscription row)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout_s}s (last: {value!r})")
        await asyncio.sleep(0.01)
