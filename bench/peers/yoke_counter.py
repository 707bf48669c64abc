"""Yoke's side of bench/peers.py: a keyed actor (one instance per key,
concurrency 1) that adds each event's ``n`` to a counter in its durable state;
with PEERS_EFFECT=1 it also appends one event per input (a journaled effect).
``yoke serve --app yoke_counter:app`` with this folder as the working
directory."""

from __future__ import annotations

import os

from yoke import App, Filter

import probe

EFFECT = os.environ.get("PEERS_EFFECT") == "1"

app = App()


@app.actor("counter", filter=Filter(types=["count"], key="payload.k"), concurrency=1)
async def counter(ctx, event) -> None:  # noqa: ANN001
    await ctx.state.update(lambda s: {"count": s.get("count", 0) + 1, "sum": s.get("sum", 0) + event.payload["n"]})
    if EFFECT:
        await ctx.append({"type": "counted", "payload": {"k": ctx.instance.key, "n": event.payload["n"]}},
                         stream="/counted")
    probe.done(event.payload["seq"])
