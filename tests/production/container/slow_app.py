"""The application tests/production/test_container.py mounts into Yoke's
image: ``slow`` marks when it starts, takes a second, then marks that it
finished, so a stop in the middle shows whether the run was drained;
``whoami`` says which container ran it."""

from __future__ import annotations

import asyncio
import socket

import yoke

app = yoke.App()


@app.actor("slow", filter={"types": ["job"]}, singleton=True)
async def slow(ctx, event):  # noqa: ANN001, ANN201
    await ctx.append({"type": "job.started", "payload": event.payload}, stream="/progress")
    await asyncio.sleep(1.0)
    await ctx.append({"type": "job.finished", "payload": event.payload}, stream="/progress")


@app.actor("whoami", filter={"types": ["who"]}, singleton=True)
async def whoami(ctx, event):  # noqa: ANN001, ANN201
    """Says which container ran it (compose's worker takeover)."""
    await ctx.append({"type": "seen", "payload": {**event.payload, "host": socket.gethostname()}}, stream="/seen")
