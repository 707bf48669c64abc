"""``X-Request-ID``: every request gets an id, its answer echoes it, and every
log line made while handling it carries it (``yoke.logs.REQUEST_ID``), the
access log line included (uvicorn writes it from inside ``send``).

An id a client or proxy sends is kept when it is 1-128 visible ASCII
characters (so it cannot break a log line); otherwise a new one is made.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from ..logs import REQUEST_ID

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

HEADER = b"x-request-id"
VALID = re.compile(rb"[\x21-\x7e]{1,128}")


def request_id(headers: list[tuple[bytes, bytes]]) -> str:
    """The request's own id when it sent a usable one, else a new one."""
    for name, value in headers:
        if name == HEADER:
            if VALID.fullmatch(value):
                return value.decode("ascii")
            break
    return secrets.token_hex(8)


class RequestIds:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope["headers"])
        echoed = (HEADER, rid.encode("ascii"))

        async def send_with_id(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), echoed]
            await send(message)

        token = REQUEST_ID.set(rid)
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            REQUEST_ID.reset(token)
