"""``yoke worker --metrics-port``: ``/metrics`` (and ``/healthz``) on the
worker's own event loop, so that a worker's ``yoke_actor_*`` and
``yoke_subscription_*`` series can be scraped. A tiny HTTP/1.1 server and no
API: one request per connection, GET or HEAD, nothing else routed. Who may
read it is ``metrics_access.py``'s rule (``metrics_host`` decides loopback).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from .. import errors
from .metrics_access import MetricsAccess

HEAD_LIMIT = 16 * 1024
HEAD_TIMEOUT_S = 10.0
REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed"}


def answer(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
           extra: dict[str, str] | None = None, head_only: bool = False) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS[status]}", f"Content-Type: {content_type}",
             f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else body)


class MetricsServer:
    def __init__(self, runtime: Any, host: str, port: int, access: MetricsAccess) -> None:
        self._runtime = runtime
        self.host = host
        self.port = port
        self._access = access
        self._server: asyncio.Server | None = None

    @classmethod
    def of(cls, runtime: Any) -> MetricsServer:
        settings = runtime.settings
        return cls(runtime, settings.metrics_host, settings.metrics_port,
                   MetricsAccess.of(settings, settings.metrics_host))

    @property
    def closed_reason(self) -> str:
        return self._access.closed_reason

    async def start(self, sock: socket.socket | None = None) -> None:
        """Serve on ``sock`` (bound before the runtime opened: a busy port
        fails at once), else listen now (``OSError`` when the port cannot be had)."""
        if sock is not None:
            self._server = await asyncio.start_server(self._handle, sock=sock, limit=HEAD_LIMIT)
        else:
            self._server = await asyncio.start_server(self._handle, self.host, self.port, limit=HEAD_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            writer.write(self._respond(head))
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that sent no request (or too large a head) gets none
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _respond(self, head: bytes) -> bytes:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return answer(400, b"not an HTTP/1.1 request\n")
        method, target = parts[0], parts[1].split("?", 1)[0]
        if target not in ("/metrics", "/healthz"):
            return answer(404, b"this port serves /metrics and /healthz only\n")
        if method not in ("GET", "HEAD"):
            return answer(405, b"GET or HEAD\n", extra={"Allow": "GET, HEAD"})
        head_only = method == "HEAD"
        if target == "/healthz":
            return answer(200, b'{"status":"ok"}', "application/json", head_only=head_only)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        try:
            self._access.check(headers.get("authorization"))
        except errors.Unauthorized as exc:
            return answer(401, exc.message.encode() + b"\n", extra={"WWW-Authenticate": "Bearer"}, head_only=head_only)
        return answer(200, self._runtime.exposition(), CONTENT_TYPE_LATEST, head_only=head_only)
