"""``yoke serve``: the HTTP API on uvicorn, with graceful shutdown.

On SIGTERM/SIGINT the server stops accepting connections, ends live tails
(their SSE responses finish cleanly), lets in-flight requests complete, and
then closes the runtime, which commits every queued append.

With an ``App`` the runtime also runs the application's executor in this
process (fan-out, scheduler, schedules, portal loops), unless
``executor=False``: then the server is the control plane only (API,
portals, appends stored without fan-out) and ``yoke worker`` processes run
the actors.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import uvicorn

from .. import runtime as runtime_module
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
    """The admin token of tenant 'default' in ``token_file`` (mode 0600),
    created on first start and recreated if it no longer authenticates."""
    if token_file.exists():
        token = token_file.read_text().strip()
        try:
            info = await runtime.tokens.authenticate(token)
            if info.tenant == "default" and "admin" in info.scopes:
                return token
        except Exception:  # not valid for this database: make a new one
            pass
    new = await runtime.tokens.create("default", ["admin"], name="yoke serve admin")
    token_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new.token + "\n")
    os.chmod(token_file, 0o600)
    return new.token


def serve(
    settings: Settings,
    *,
    app: App | None = None,
    executor: bool = True,
    on_ready: Callable[[Settings, str], None] | None = None,
) -> None:
    # SSE heartbeats are sent on the tails' sweep: make it tick often enough.
    settings = replace(settings, tail_sweep_s=min(settings.tail_sweep_s, settings.sse_heartbeat_s))
    shutdown = asyncio.Event()
    token_file = Path(settings.data_dir) / "token"

    @asynccontextmanager
    async def open_runtime() -> AsyncIterator[Runtime]:
        async with runtime_module.open(settings=settings, app=app, executor=executor) as runtime:
            token = await ensure_admin_token(runtime, token_file)
            if on_ready is not None:
                on_ready(settings, token)
            yield runtime

    api = create_app(open_runtime, heartbeat_s=settings.sse_heartbeat_s, shutdown=shutdown)

    def stop_tails() -> None:
        shutdown.set()
        runtime = getattr(api.state, "runtime", None)
        if runtime is not None:
            runtime.appends.stop_blocking()  # producers waiting for credit: 503 now
            runtime.hub.wake_all()  # idle tails notice the stop now
    limits = ConnectionLimits(
        header_timeout_s=settings.http_header_timeout_s,
        body_timeout_s=settings.http_body_timeout_s,
        max_connections=settings.http_max_connections,
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
    _Server(config, stop_tails).run()
