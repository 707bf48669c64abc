"""Portals: HTTP ingress handlers that turn requests into appended events.

``@app.portal("github")`` mounts ``async def handle(ctx, request)`` at
``/v1/portals/github`` (and any sub-path). The handler returns a JSON value
(200), ``(status, value)``, or None (204). A portal's optional ``start(ctx)``
loop runs with the executor, is restarted with backoff when it crashes and
is cancelled on shutdown. An actor calls a portal's methods with
``ctx.portals.call`` (carried out by ops.py's ``portal_call``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from .. import errors
from .app import App, PortalDef
from .context import PortalContext
from .ops import OpHandler

if TYPE_CHECKING:
    from .kernel import ActorKernel

log = logging.getLogger("yoke.actors.portals")

RESTART_MAX_S = 30.0


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


def portal_context(
    kernel: ActorKernel, app: App | None, portal: PortalDef, tenant: str | None = None,
    *, worker_id: str | None = None,
) -> PortalContext:
    """``worker_id``: this process's executor, if one runs (the owner of
    the instances the portal creates)."""
    return PortalContext(OpHandler(kernel, app, tenant or portal.tenant, None, worker_id=worker_id), portal.name)


async def handle_request(
    kernel: ActorKernel, app: App, name: str, request: PortalRequest, tenant: str | None = None,
    *, worker_id: str | None = None,
) -> tuple[int, Any]:
    portal = app.portals.get(name)
    if portal is None:
        raise errors.PortalNotFound(portal=name)
    result = await portal.handler(portal_context(kernel, app, portal, tenant, worker_id=worker_id), request)
    if result is None:
        return 204, None
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], int):
        return result[0], result[1]
    return 200, result


async def run_loop(kernel: ActorKernel, app: App, portal: PortalDef, *, worker_id: str | None = None) -> None:
    """Run ``portal.start_fn`` until cancelled, restarting it with backoff."""
    assert portal.start_fn is not None
    delay = 0.1
    while True:
        try:
            await portal.start_fn(portal_context(kernel, app, portal, worker_id=worker_id))
            delay = 0.1  # a loop that returns is restarted too (it is meant to run forever)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("portal %s loop crashed; restarting in %.1fs", portal.name, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RESTART_MAX_S)
            continue
        await asyncio.sleep(delay)
