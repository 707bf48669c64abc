"""An application with a Node actor (tests/actors/test_node_host.py):
``js`` is tests/actors/node/worker.mjs, which does what the event's payload
says (``js_atomic`` too, in atomic mode); ``patient`` is a Python actor beside it."""

from __future__ import annotations

import os
from pathlib import Path

from yoke import App

HERE = Path(__file__).parent / "node"

app = App()
app.node_actor("js", HERE / "worker.mjs", timeout_s=3, max_attempts=2, retry_base_s=0.05, retry_max_s=0.1)
# The same script in atomic mode (docs/advanced/effects.md).
app.node_actor("js_atomic", HERE / "worker.mjs", timeout_s=3, max_attempts=2, retry_base_s=0.05, retry_max_s=0.1,
               effects="atomic")
# Keeps what its runs draw with ctx.random() (tests/actors/test_forks.py).
app.node_actor("lucky", HERE / "lucky.mjs", timeout_s=3)


@app.actor("patient")
async def patient(ctx, event):
    await ctx.state.update(lambda s: {**s, "done": s.get("done", 0) + 1, "pid": os.getpid()})
