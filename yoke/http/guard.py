"""Checks every HTTP request passes before any route sees it.

A NUL character cannot be stored in PostgreSQL text (SQLite would store it),
so the two backends would answer a NUL differently: a 500 on one, a miss on
the other. Rather than trust every route and every store query to check its
own strings, no URL with a NUL in its path or query string gets past this
layer: 400 ``invalid_input`` naming the part (``path`` or the query
parameter). A raw NUL byte never reaches here (the HTTP parser refuses it);
``%00`` is what decodes to one. JSON bodies are checked where they are
turned into stored text (``events.json_text`` / ``check_text``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from .. import errors
from .responses import error_response

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]


class RequestGuard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            problem = url_problem(scope)
            if problem is not None:
                await error_response(problem)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def url_problem(scope: Scope) -> errors.YokeError | None:
    """What is wrong with the request's URL, if anything."""
    if "\x00" in scope["path"]:
        return errors.InvalidInput("the URL path must not contain NUL characters", field="path")
    query: bytes = scope.get("query_string", b"")
    if b"%00" in query:
        for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
            if "\x00" in name or "\x00" in value:
                return errors.InvalidInput(
                    "query parameters must not contain NUL characters",
                    field=name.replace("\x00", "\\0")[:80],
                )
    return None
