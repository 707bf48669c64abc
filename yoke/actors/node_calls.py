"""Calls into a JavaScript application's Node host (``defineApp``,
applications.py): its portals' ``handle``, methods and ``start`` loop, and
its subscription receivers.

The ``PortalDef`` a JavaScript portal gets has Python functions for its
handler, methods and loop, so the portal route (portals.py
``handle_request``), actors' ``ctx.portals.call`` (ops.py ``call_method``)
and the executor's loops (portals.py ``run_loop``) use it as any portal;
a receiver is a Python function the deliveries call with each batch, as a
Python one. Each call takes a host of this process's Node pool (the
executor's, ``App.hosts``), runs there (a portal with the caller's op
handler: its ``ctx`` ops come back to it), and gives it back.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .. import errors
from .app import App, PortalDef

if TYPE_CHECKING:
    from .context import PortalContext
    from .portals import PortalRequest


def node_portal_def(name: str, script: str, tenant: str, methods: list[str], *, loop: bool = False) -> PortalDef:
    async def handle(ctx: PortalContext, request: PortalRequest) -> tuple[int, Any]:
        answer = await _call(ctx, name, "request", {"request": {
            "method": request.method, "path": request.path, "query": request.query, "headers": request.headers,
            "body": base64.b64encode(request.body).decode(),
        }})
        return int(answer["status"]), answer.get("body")

    def method(method_name: str) -> Any:
        async def call(ctx: PortalContext, params: Any) -> Any:
            return (await _call(ctx, name, "method", {"method": method_name, "params": params})).get("body")

        return call

    async def start(ctx: PortalContext) -> None:
        # The loop holds a host of the pool while it runs (portals.run_loop
        # restarts it with backoff when it ends or throws).
        await _call(ctx, name, "start", {})

    return PortalDef(name, handle, tenant, start_fn=start if loop else None, methods={m: method(m) for m in methods},
                     language="node", script=script)


def node_receiver(app: App, name: str) -> Callable[[dict[str, Any]], Awaitable[None]]:
    """A ``call`` receiver of ``app``'s Node host: the module's
    ``receivers[name](batch)``; returning acknowledges the batch, throwing
    fails it (the subscription's retry ladder)."""

    async def receive(batch: dict[str, Any]) -> None:
        pool = app.hosts.get("node")
        if pool is None:
            raise errors.Unavailable(f"receiver {name!r} runs on Node, and this process runs no executor to host it")
        host = await pool.acquire()
        await pool.receive(host, name, batch)

    receive.language, receive.script = "node", app.spec  # type: ignore[attr-defined] - the executor's pool loads it
    return receive


async def _call(ctx: PortalContext, portal: str, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    ops = ctx.ops
    pool = ops.app.hosts.get("node") if ops.app is not None else None  # type: ignore[attr-defined]
    if pool is None:
        raise errors.Unavailable(f"portal {portal!r} runs on Node, and this process runs no executor to host it")
    caller = pool.calling_host()
    if caller is not None:  # a run on one of these hosts calls: the same host answers
        return await pool.portal(caller, ops, portal, kind, payload, borrowed=True)
    host = await pool.acquire()
    return await pool.portal(host, ops, portal, kind, payload)
