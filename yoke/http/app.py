"""The FastAPI application: routers, error handling, metrics middleware."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

from .. import __version__, errors, metrics
from . import (
    actors, console, docs, failures, forks, health, objects, overview, portals, sql, streams, subscriptions, tokens,
    workflow,
)
from .durable_streams import openapi as durable_streams
from .auth import TokenCache
from .expensive_tails import ExpensiveTails
from .durable_streams import DurableStreams
from .guard import RequestGuard
from .cors import Cors, CorsPolicy
from .fast_append import HotPath
from .request_ids import RequestIds
from .trace_context import TraceContext
from .responses import http_error_handler, internal_error_handler, validation_error_handler, yoke_error_handler
from .schemas import complete

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]], Awaitable[None]]


def create_app(
    open_runtime: Callable[[], Any],
    *,
    heartbeat_s: float = 15.0,
    shutdown: asyncio.Event | None = None,
    dev: bool = False,
) -> FastAPI:
    """``open_runtime()`` returns an async context manager yielding the Runtime
    (opened at startup, closed at shutdown, after in-flight requests end)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with open_runtime() as runtime:
            serve_runtime(app, runtime)
            yield
            app.state.shutdown.set()

    app = FastAPI(
        title="Yoke",
        version=__version__,
        description=(
            "Durable event streams: append, read, tail (SSE), acknowledge, backpressure;"
            " subscriptions (copies, calls, processors, webhooks); actor instances, their queues and"
            " dead letters; portals."
        ),
        lifespan=lifespan,
        docs_url=None,  # docs.install: /docs and /redoc served with their assets, offline
        redoc_url=None,
    )
    docs.install(app)
    console.install(app)
    app.state.expensive_tails = ExpensiveTails()
    app.state.heartbeat_s = heartbeat_s
    app.state.dev = dev  # no token needed (yoke serve --dev, loopback only)
    app.state.shutdown = shutdown or asyncio.Event()
    app.add_exception_handler(errors.YokeError, yoke_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, http_error_handler)
    app.add_exception_handler(Exception, internal_error_handler)  # a 500 is JSON too
    # Routers with ``{path:path}/-/...`` routes come before streams, whose
    # ``{path:path}`` catch-alls would otherwise match them.
    routers = [m.router for m in (health, console, overview, tokens, objects, subscriptions, streams, workflow, actors,
                                  forks, failures, sql, portals, durable_streams)]
    for router in routers:
        app.include_router(router)
    # Every route, for the hints of a 405 (hints.py): the application's own
    # (the documents) and the routers' (FastAPI nests included routers).
    app.state.routes = [r for r in app.router.routes if isinstance(r, Route)] + [
        r for router in routers for r in router.routes
    ]
    document = app.openapi

    def openapi() -> dict[str, Any]:
        """FastAPI's document, completed (``schemas.complete``)."""
        if app.openapi_schema is None:
            complete(document())
        return document()

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def serve_runtime(app: FastAPI, runtime: Any) -> None:
    """The app serves ``runtime`` (the lifespan does this once it is open).
    The token cache is made with it, as it is: its entries age by the
    runtime's clock."""
    app.state.runtime = runtime
    app.state.token_cache = TokenCache(clock=runtime.clock)


def asgi_app(app: FastAPI, cors: CorsPolicy | None = None) -> ASGIApp:
    """What the server runs: request ids around the CORS policy (when one is
    set) around request metrics around the URL guard around the Durable
    Streams protocol around the append hot path around FastAPI (lifespan
    events pass straight through); the caller's trace context is current
    inside the request ids (their log lines carry both)."""
    inner: ASGIApp = RequestMetrics(RequestGuard(DurableStreams(HotPath(app, app.state), app.state)))
    return RequestIds(TraceContext(inner if cors is None else Cors(inner, cors), app.state))


class RequestMetrics:
    """Counts requests by route template (not raw path), method and status."""

    # Label children kept, so a request does not look them up (prometheus'
    # ``labels()`` validates and locks each time); bounded, as a client
    # chooses the method.
    KEPT = 1024

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._counters: dict[tuple[str, str, int], Any] = {}
        self._timers: dict[str, Any] = {}

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def capture(message: MutableMapping[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            key = (template, scope["method"], status)
            counter = self._counters.get(key)
            if counter is None:
                counter = metrics.HTTP_REQUESTS.labels(template, scope["method"], str(status))
                if len(self._counters) < self.KEPT:
                    self._counters[key] = counter
            counter.inc()
            timer = self._timers.get(template)
            if timer is None:
                timer = metrics.HTTP_LATENCY.labels(template)
                if len(self._timers) < self.KEPT:
                    self._timers[template] = timer
            timer.observe(time.perf_counter() - started)
