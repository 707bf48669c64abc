"""Portals: HTTP ingress handlers that turn requests into appended events.

``@app.portal("github")`` mounts ``async def handle(ctx, request)`` at
``/v1/portals/github`` (and any sub-path). The handler returns a JSON value
(200), ``(status, value)``, or None (204). A portal's optional ``start(ctx)``
loop runs with the executor, is restarted with backoff when it crashes and
is cancelled on shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from ..events import json_bytes
from .app import App, PortalDef
from .context import PortalContext
from .ops import OpHandler

if TYPE_CHECKING:
    from ..runtime import Runtime

log = logging.getLogger("yoke.actors.portals")

RESTART_MAX_S = 30.0
CALL_TIMEOUT_S = 30.0  # ctx.portals.call's default
MAX_CALL_TIMEOUT_S = 3600.0


@dataclass
class PortalRequest:
    method: str
    path: str  # below /v1/portals/<name>, starting with '/'
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self) -> Any:
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise errors.InvalidInput("the request body is not JSON") from None


def portal_context(runtime: Runtime, portal: PortalDef, tenant: str | None = None) -> PortalContext:
    return PortalContext(OpHandler(runtime, tenant or portal.tenant, None), portal.name)


async def handle_request(
    runtime: Runtime, app: App, name: str, request: PortalRequest, tenant: str | None = None
) -> tuple[int, Any]:
    portal = app.portals.get(name)
    if portal is None:
        raise errors.PortalNotFound(portal=name)
    result = await portal.handler(portal_context(runtime, portal, tenant), request)
    if result is None:
        return 204, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], int):
        return result[0], result[1]
    return 200, result


def check_timeout(timeout_s: Any) -> float:
    if (
        isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
        or not 0 < timeout_s <= MAX_CALL_TIMEOUT_S
    ):
        raise errors.InvalidInput(
            f"timeout_s must be more than 0 and at most {MAX_CALL_TIMEOUT_S:g} seconds", field="timeout_s"
        )
    return float(timeout_s)


async def call_method(
    runtime: Runtime, tenant: str, name: str, method: str, params: Any, timeout_s: float
) -> Any:
    """Run a portal method for an actor of ``tenant``: the method gets a
    portal context in that tenant and ``params`` (JSON); its answer goes back
    as JSON. A YokeError it raises reaches the caller as it is; any other
    exception, or an answer that is not JSON, is ``PortalCallFailed``; no
    answer within ``timeout_s`` is ``PortalTimeout`` (the method is cancelled)."""
    app = runtime.app
    portal = None if app is None else app.portals.get(name)
    if portal is None:
        raise errors.PortalNotFound(f"no portal named {name!r}", portal=name)
    fn = portal.methods.get(method)
    if fn is None:
        raise errors.PortalMethodNotFound(
            f"portal {name!r} has no method {method!r}", portal=name, method=method
        )
    try:
        async with asyncio.timeout(timeout_s):
            result = await fn(portal_context(runtime, portal, tenant), params)
    except TimeoutError:
        raise errors.PortalTimeout(
            f"portal {name!r} method {method!r} did not answer within {timeout_s:g}s",
            portal=name, method=method, timeout_s=timeout_s,
        ) from None
    except errors.YokeError:
        raise
    except Exception as exc:
        log.warning("portal %s method %s failed: %r", name, method, exc)
        raise errors.PortalCallFailed(
            f"portal {name!r} method {method!r} failed: {type(exc).__name__}: {exc}"[:4096],
            portal=name, method=method, error=type(exc).__name__,
        ) from None
    try:
        return orjson.loads(json_bytes(result, "result"))
    except errors.YokeError as exc:
        raise errors.PortalCallFailed(
            f"portal {name!r} method {method!r} answered a value that is not JSON: {exc.message}",
            portal=name, method=method, error="not_json",
        ) from None


async def run_loop(runtime: Runtime, portal: PortalDef) -> None:
    """Run ``portal.start_fn`` until cancelled, restarting it with backoff."""
    assert portal.start_fn is not None
    delay = 0.1
    while True:
        try:
            await portal.start_fn(portal_context(runtime, portal))
            delay = 0.1  # a loop that returns is restarted too (it is meant to run forever)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("portal %s loop crashed; restarting in %.1fs", portal.name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)
            continue
        await asyncio.sleep(delay)
