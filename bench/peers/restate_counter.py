"""Restate's side of bench/peers.py: a Virtual Object (one per key; its
exclusive handler runs one invocation per key at a time) whose ``add``
handler adds the input's ``n`` to a counter in its K/V state; with
PEERS_EFFECT=1 it also journals one effect per input (a ``ctx.run`` step,
Restate's durable side-effect record). ``get`` is a shared handler that reads
the state back. Served by hypercorn (HTTP/2), as Restate's Python docs do."""

from __future__ import annotations

import os

import restate
from restate import ObjectContext, ObjectSharedContext, VirtualObject

import probe

EFFECT = os.environ.get("PEERS_EFFECT") == "1"

counter = VirtualObject("Counter")


@counter.handler()
async def add(ctx: ObjectContext, event: dict) -> None:
    state = await ctx.get("state") or {"count": 0, "sum": 0}
    ctx.set("state", {"count": state["count"] + 1, "sum": state["sum"] + event["n"]})
    if EFFECT:
        key = ctx.key()

        async def counted() -> dict:
            return {"type": "counted", "payload": {"k": key, "n": event["n"]}}

        await ctx.run_typed("append", counted)
    probe.done(event["seq"])


@counter.handler(kind="shared")
async def get(ctx: ObjectSharedContext) -> dict:
    return await ctx.get("state") or {"count": 0, "sum": 0}


app = restate.app(services=[counter])
