"""The caller's trace context on every request (W3C ``traceparent`` and
``tracestate``, or whatever the process's propagators read): made current
while the request is handled, so an append it makes is a child of the
caller's span and the events carry that trace (docs/advanced/tracing.md).
Nothing happens while tracing is off."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from opentelemetry import context as otel_context

from ..tracing import extract_headers

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]


class TraceContext:
    def __init__(self, app: ASGIApp, state: Any) -> None:
        self.app = app
        self.state = state  # the FastAPI app's: its runtime, once serving

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        runtime = getattr(self.state, "runtime", None)
        if scope["type"] != "http" or runtime is None or not runtime.tracing.on:
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]}
        token = otel_context.attach(extract_headers(headers))
        try:
            await self.app(scope, receive, send)
        finally:
            otel_context.detach(token)
