"""The application of tests/actors/test_rebalance.py: one keyed actor whose
runs say where they start and end, on /runs, so the test can see each
instance's runs in commit order and which worker process ran them."""

from __future__ import annotations

import asyncio
import os

from yoke import App, Filter

app = App()


@app.actor("counter", filter=Filter(types=["job"], key="payload.k"), timeout_s=2)
async def counter(ctx, event):
    mark = {"instance": ctx.instance.instance_id, "pid": os.getpid(), "seq": event.payload["seq"]}
    await ctx.append({"type": "run.start", "payload": mark}, "/runs")
    await asyncio.sleep(0.005)  # some work: a run spans the two appends
    await ctx.append({"type": "run.end", "payload": mark}, "/runs")
