"""``yoke serve``: the HTTP API on uvicorn, with graceful shutdown.

On SIGTERM/SIGINT the server stops accepting connections, ends live tails
(their SSE responses finish cleanly), lets in-flight requests complete, and
then closes the runtime, which commits every queued append.

With an ``App`` the runtime also runs the application's executor in this
process (fan-out, scheduler, schedules, portal loops), unless
``executor=False``: then the server is the control plane only (API,
portals, appends stored without fan-out) and ``yoke worker`` processes run
the actors.

The listening socket is bound before anything else happens (the runtime
opens, the banner is printed), so a busy port fails at once with an
``OSError`` (``errno.EADDRINUSE``) and nothing announced. The admin token of
tenant ``default`` goes to ``<data_dir>/token-<port>`` (``admin_token.py``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import uvicorn

from .. import errors, heap, metrics
from .. import runtime as runtime_module
from ..actors.app import App
from ..config import Settings
from ..runtime import Runtime
from . import admin_token
from .addresses import is_loopback, url_host
from .app import asgi_app, create_app
from .cors import CorsPolicy
from .metrics_access import MetricsAccess
from .connection_limits import ConnectionLimits, protocol_class

__all__ = ["bind_socket", "is_loopback", "serve", "url_host"]


@asynccontextmanager
async def _entered(opened: Any, value: Any) -> AsyncIterator[Any]:
    """The rest of ``async with`` for a context manager already entered."""
    try:
        yield value
    except BaseException as exc:
        if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
            raise
    else:
        await opened.__aexit__(None, None, None)


def _short_startup_failure(app: Any, refused: list[errors.YokeError]) -> Any:
    """The ASGI app, except that a start refused with a YokeError (a newer
    schema, a login without the grants it needs) reaches uvicorn without
    its traceback: the command prints the one line that says what to do."""

    async def lifespan(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return

        async def send_short(message: Any) -> None:
            if message["type"] == "lifespan.startup.failed" and refused:
                message = {**message, "message": ""}
            await send(message)

        await app(scope, receive, send_short)

    return lifespan


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Live tails end, so their connections can drain. (A signal handler:
        # hand the work to the event loop.)
        asyncio.get_event_loop().call_soon_threadsafe(self._on_exit)
        super().handle_exit(sig, frame)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)``; ``OSError`` (EADDRINUSE,
    EACCES, EADDRNOTAVAIL, ...) if it cannot be had. Listening at once also
    claims the port against a second server that binds at the same time."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)  # asyncio listens again with uvicorn's backlog
    except BaseException:
        sock.close()
        raise
    return sock


def serve(
    settings: Settings,
    *,
    app: App | None = None,
    executor: bool = True,
    on_ready: Callable[[Settings, str, str | None, list[Any]], None] | None = None,
    sock: socket.socket | None = None,
    dev: bool = False,
    announce: bool = True,
    on_stop: Callable[[], None] | None = None,
    sign_in_link: bool = True,
    rotate_token: bool = False,
) -> None:
    """Serve until SIGTERM/SIGINT on ``sock`` (from ``bind_socket``), else
    on a socket bound first: a busy port raises OSError before the runtime
    opens. ``on_ready`` gets the settings with the bound port (``port=0``
    picks a free one), the admin token and, with ``sign_in_link``, the
    console's sign-in link (a one-time code; else None and no code exists)
    and what starting did to the app's declared subscriptions (``Reconciled``).
    ``rotate_token``: a new admin token replaces the directory's
    (``admin_token.py``). ``dev``: requests without a token act as tenant
    ``default`` with every scope; only on a loopback address.
    ``announce=False``: a second process on the same socket (workers.py),
    which neither writes the token file nor calls ``on_ready``. ``on_stop``
    is called when a stop signal arrives."""
    if dev and not is_loopback(settings.host):
        raise ValueError("dev mode serves without authentication: loopback addresses only")
    if sock is None:
        sock = bind_socket(settings.host, settings.port)
    # SSE heartbeats are sent on the tails' sweep: make it tick often enough.
    settings = replace(
        settings,
        port=sock.getsockname()[1],
        tail_sweep_s=min(settings.tail_sweep_s, settings.sse_heartbeat_s),
    )
    shutdown = asyncio.Event()
    refused: list[errors.YokeError] = []  # why the runtime would not open (schema, roles, state)
    cors = CorsPolicy.parse(settings.cors_origins)  # ValueError for a bad list, before anything starts
    scheme = "https" if settings.tls_cert else "http"

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        opening = runtime_module.open(settings=settings, app=app, executor=executor)
        try:
            runtime = await opening.__aenter__()
        except errors.YokeError as exc:
            refused.append(exc)
            raise
        async with _entered(opening, runtime):
            heap.settle()
            metrics.announce_build()
            sampler = runtime.sampler()  # the database-sampled gauges, refreshed in the background
            sampler.start()
            try:
                if announce:
                    token = await admin_token.ensure(runtime, settings.data_dir, settings.port, rotate=rotate_token)
                    if on_ready is not None:
                        link = None
                        console = f"{scheme}://{url_host(settings.host)}:{settings.port}/ui/"
                        if dev:  # under --dev the console needs no sign-in
                            link = console
                        elif sign_in_link:
                            link = f"{console}#code={api.state.login_codes.issue()}"
                        on_ready(settings, token, link, runtime.subscriptions_reconciled)
                yield runtime
            finally:
                await sampler.stop()

    api = create_app(open_runtime, heartbeat_s=settings.sse_heartbeat_s, shutdown=shutdown, dev=dev)
    api.state.metrics_access = MetricsAccess.of(settings, settings.host, behind_proxy=settings.proxy_headers)

    def stop_tails() -> None:
        if on_stop is not None:
            on_stop()
        shutdown.set()
        runtime = getattr(api.state, "runtime", None)
        if runtime is not None:
            runtime.appends.stop_blocking()  # producers waiting for credit: 503 now
            runtime.hub.wake_all()  # idle tails notice the stop now
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        max_connections=settings.http_max_connections,
        max_connections_per_client=settings.http_max_connections_per_client,
        max_head_bytes=settings.http_max_head_bytes,
    )
    config = uvicorn.Config(
        _short_startup_failure(asgi_app(api, cors), refused),
        host=settings.host,
        port=settings.port,
        # Logging is yoke.logs.setup's (the CLI's): uvicorn's loggers
        # propagate to its handler, at its level and in its format.
        log_config=None,
        log_level=None,
        access_log=settings.access_log,
        # Behind a TLS-terminating proxy: the scheme (Secure cookies) and the
        # client's address from X-Forwarded-Proto/-For, from trusted proxies only.
        # Off by default: no per-request layer.
        proxy_headers=settings.proxy_headers,
        forwarded_allow_ips=settings.forwarded_allow_ips,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
        lifespan="on",
        # Deadlines, the connection cap and JSON answers at the connection
        # level (yoke/http/connection_limits.py); the cap is ours, not limit_concurrency.
        http=protocol_class(limits),
        timeout_keep_alive=settings.http_keep_alive_s,  # type: ignore[arg-type]
        ws="none",  # no WebSocket routes
    )
    # run() picks uvloop when it is installed (uvicorn[standard] brings it).
    try:
        _Server(config, stop_tails).run(sockets=[sock])
    except SystemExit:  # uvicorn's exit when the startup failed
        if not refused:
            raise
    finally:
        sock.close()
    if refused:  # the caller says it in one line (uvicorn was told no traceback)
        raise refused[0]
