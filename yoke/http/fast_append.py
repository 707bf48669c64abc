"""The append route without the framework in the way.

``POST /v1/streams{path}/-/events`` is the hottest route. Profiling showed
FastAPI's routing and dependency solving costing several times the append
itself, so this small ASGI layer answers that one route directly, with the
same functions the FastAPI route uses (``authorize``, ``append_body``) and
the same responses; every other request goes to FastAPI, which also keeps
documenting this route in the OpenAPI schema.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from starlette.responses import Response

from .. import errors
from .auth import authorize, bearer_token
from .session import credentials
from .responses import check_json_content_type, error_response, json_response, parse_json
from .streams import append_body, stream_of_principal

log = logging.getLogger("yoke.http")

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]

APPEND_ROUTE = re.compile(r"^/v1/streams(.*)/-/events$")
MAX_BODY_BYTES = 64 * 1024 * 1024


class _Route:
    """What the request metrics read from ``scope["route"]``."""

    path = "/v1/streams{path:path}/-/events"


class HotPath:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app's state: runtime, token cache

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = APPEND_ROUTE.match(scope["path"])
            if match is not None:
                scope["route"] = _Route
                # scope["path"] is already percent-decoded, as FastAPI sees it.
                response = await self._append(scope, receive, match.group(1))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _append(self, scope: Scope, receive: Any, path: str) -> Response:
        try:
            headers: dict[str, str] = {}
            for name, value in scope["headers"]:  # the first of repeated headers, as Starlette does
                headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
            query: dict[str, str] = {}
            for name, value in parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True):
                query.setdefault(name, value)
            token = credentials("POST", headers, bearer_token(headers.get("authorization")))
            principal = await authorize(self.state, token, query.get("tenant"), "append")
            check_json_content_type(headers)
            body = await read_body(receive)
            stream = stream_of_principal(self.state.runtime, principal, path)
            return await append_body(stream, parse_json(body), headers.get("idempotency-key"))
        except errors.YokeError as exc:
            return error_response(exc)
        except Exception:
            log.exception("append failed")
            return json_response({"error": {"code": "internal_error", "message": "internal error"}}, 500)


async def read_body(receive: Any, limit: int = MAX_BODY_BYTES) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise errors.InvalidInput("the client went away", field="body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.EventTooLarge(f"a request body is at most {limit} bytes", limit=limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
