"""The application the virtual-time tests run: a reminder a week out, a
daily cron, an actor that always fails (the tests add a webhook
subscription, pointed at their receiver)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from yoke import App, Filter

app = App(name="virtual-time", version="vt-1")

WEEK = dt.timedelta(days=7)
NODE_SCRIPT = Path(__file__).parent / "clock_in_node.mjs"


@app.actor("reminder", filter=Filter(types=["reminder.requested", "reminder.due"], key="payload.who"))
async def reminder(ctx, event):  # noqa: ANN001, ANN201
    if event.type == "reminder.requested":
        await ctx.schedules.upsert(
            "remind", at=ctx.now() + WEEK, event={"type": "reminder.due", "payload": {"who": ctx.instance.key}}
        )
        await ctx.state.set({"requested_at": ctx.now().isoformat(), "fired_at": None})
    else:
        await ctx.state.update(lambda s: {**s, "fired_at": ctx.now().isoformat()})


@app.actor("ticker", filter=Filter(types=["ticker.start", "tick"], key="payload.name"))
async def ticker(ctx, event):  # noqa: ANN001, ANN201
    if event.type == "ticker.start":
        # Every day at 06:00 UTC.
        await ctx.schedules.upsert("daily", cron="0 6 * * *", event={"type": "tick", "payload": {"name": ctx.instance.key}})
        await ctx.state.set({"ticks": []})
    else:
        await ctx.state.update(lambda s: {"ticks": [*s["ticks"], ctx.now().isoformat()]})


@app.actor(
    "flaky", filter=Filter(types=["job"], key="payload.id"), max_attempts=5, retry_base_s=60, retry_max_s=3600,
)
async def flaky(ctx, event):  # noqa: ANN001, ANN201
    await ctx.state.update(lambda s: {"attempts": [*(s or {}).get("attempts", []), ctx.now().isoformat()]}, default={})
    raise RuntimeError("the payment provider is down")



# ctx.now() in host processes: the runtime's clock, not the machine's.
@app.actor("clock_in_host", filter=Filter(types=["what.time"], key="payload.who"), isolation="process")
async def clock_in_host(ctx, event):  # noqa: ANN001, ANN201
    await ctx.state.set({"now": ctx.now().isoformat()})


app.node_actor("clock_in_node", NODE_SCRIPT, filter=Filter(types=["what.time.node"], key="payload.who"))
