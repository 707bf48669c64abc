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
tenant ``default`` goes to ``<data_dir>/token-<port>`` (see ``yoke.tokenfile``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvicorn

from .. import heap
from .. import runtime as runtime_module
from .. import tokenfile
from ..actors.app import App
from ..config import Settings
from ..runtime import Runtime
from .app import asgi_app, create_app
from .protocol import ConnectionLimits, protocol_class


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: Any) -> None:
        # Live tails end, so their connections can drain. (A signal handler:
        # hand the work to the event loop.)
        asyncio.get_event_loop().call_soon_threadsafe(self._on_exit)
        super().handle_exit(sig, frame)


async def ensure_admin_token(runtime: Runtime, token_file: Path) -> str:
    """The admin token of tenant 'default' in ``token_file`` (mode 0600).

    A token file next to it that authenticates on this database (written by
    a server on another port, or before restarting on a new port) is reused;
    otherwise a new token is created. Files that belong to other databases
    are left alone: their servers keep working."""
    siblings = [p for p in tokenfile.token_files(token_file.parent) if p != token_file]
    for candidate in [token_file, *siblings]:
        token = tokenfile.read_token(candidate)
        if token is None:
            continue
        try:
            info = await runtime.tokens.authenticate(token)
        except Exception:  # not valid for this database
            continue
        if info.tenant == "default" and "admin" in info.scopes:
            if candidate != token_file:
                tokenfile.write_token(token_file, token)
            return token
    new = await runtime.tokens.create("default", ["admin"], name="yoke serve admin")
    tokenfile.write_token(token_file, new.token)
    return new.token


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


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
    on_ready: Callable[[Settings, str, str], None] | None = None,
    sock: socket.socket | None = None,
    dev: bool = False,
    announce: bool = True,
    on_stop: Callable[[], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT on ``sock`` (from ``bind_socket``), else
    on a socket bound first: a busy port raises OSError before the runtime
    opens. ``on_ready`` gets the settings with the bound port (``port=0``
    picks a free one), the admin token and the console's sign-in link (a
    one-time code). ``dev``: requests without a token act as tenant
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
    token_file = tokenfile.token_file(settings.data_dir, settings.port)

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        async with runtime_module.open(settings=settings, app=app, executor=executor) as runtime:
            heap.settle()
            if not announce:
                yield runtime
                return
            token = await ensure_admin_token(runtime, token_file)
            if on_ready is not None:
                code = api.state.login_codes.issue()
                on_ready(settings, token, f"http://{url_host(settings.host)}:{settings.port}/ui/#code={code}")
            yield runtime

    api = create_app(open_runtime, heartbeat_s=settings.sse_heartbeat_s, shutdown=shutdown, dev=dev)

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
        asgi_app(api),
        host=settings.host,
        port=settings.port,
        log_level="info",
        access_log=settings.access_log,
        proxy_headers=False,  # no proxy in front by default: skip the per-request layer
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
        lifespan="on",
        # Deadlines, the connection cap and JSON answers at the connection
        # level (yoke/http/protocol.py); the cap is ours, not limit_concurrency.
        http=protocol_class(limits),
        timeout_keep_alive=settings.http_keep_alive_s,  # type: ignore[arg-type]
        ws="none",  # no WebSocket routes
    )
    # run() picks uvloop when it is installed (uvicorn[standard] brings it).
    try:
        _Server(config, stop_tails).run(sockets=[sock])
    finally:
        sock.close()
