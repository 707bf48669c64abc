"""A webhook receiver for tests: a real HTTP server on 127.0.0.1 that
records every POST and answers 200, or fails the next N (or all) with a
status the test chooses. Small on purpose: HTTP/1.1 with Content-Length
bodies and keep-alive, which is what Yoke's webhook deliveries send."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True)
class Post:
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes

    def json(self) -> Any:
        return orjson.loads(self.body)


class WebhookReceiver:
    """``url``: where to point a webhook (``/hook``, or any path under it);
    ``posts``: what arrived, in order (failed ones too); ``fail_next(n)``."""

    def __init__(self) -> None:
        self.posts: list[Post] = []
        self._fail_next = 0
        self._fail_all = False
        self._fail_status = 500
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def fail_next(self, n: int, status: int = 500) -> None:
        """Answer the next ``n`` posts with ``status``."""
        self._fail_next, self._fail_status = n, status

    def fail_all(self, status: int = 500) -> None:
        """Answer every post with ``status`` until ``succeed()``."""
        self._fail_all, self._fail_status = True, status

    def succeed(self) -> None:
        self._fail_all, self._fail_next = False, 0

    async def __aenter__(self) -> WebhookReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = {}
                for line in lines:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status = 405
                if method == "POST":
                    self.posts.append(Post(path, headers, body))
                    status = 200
                    if self._fail_all or self._fail_next > 0:
                        self._fail_next = max(self._fail_next - 1, 0)
                        status = self._fail_status
                writer.write(f"HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
