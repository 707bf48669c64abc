"""The application `yoke serve` runs in tests/ha and bench/failover.py: what
a failover must not disturb, all fed by ``order`` events on /orders.

- ``counter``: a keyed actor (one instance per ``payload.k``) that counts
  its runs in ``ctx.state`` and appends one ``order.counted`` to /counted
  per order. The append is journaled, so a run repeated after a failover
  returns the first append's offset: /counted holds each order exactly
  once. The state counts runs (at least once: a repeated run counts again).
- ``ticker``: started by one ``tick.start`` on /ticks, it appends a
  ``ticked`` to /ticked and schedules its next run ``TICK_S`` later, for
  ever: a chain of durable schedules that must survive every failover.
- ``copy``: a subscription copying /orders to /orders-copy.
- ``hook``: a webhook subscription posting each order to
  ``YOKE_HA_WEBHOOK_URL``, signed with ``YOKE_HA_WEBHOOK_SECRET``."""

from __future__ import annotations

import os

import yoke
from yoke import App, Filter

app = App(name="ha")
TICK_S = 0.25

app.subscription("/orders", "copy", yoke.copy_to_stream("/orders-copy"), start="beginning")
app.subscription(
    "/orders", "hook",
    yoke.webhook(os.environ.get("YOKE_HA_WEBHOOK_URL", "http://127.0.0.1:9/hook"),
                 secret=yoke.secret_from_env("YOKE_HA_WEBHOOK_SECRET")),
    start="beginning",
)


@app.actor("counter", filter=Filter(types=["order"], streams="/orders", key="payload.k"), timeout_s=10)
async def counter(ctx, event):
    await ctx.state.update(lambda s: {**s, "runs": s.get("runs", 0) + 1})
    # The same content on every attempt: the journal makes it one append.
    await ctx.append({"type": "order.counted", "payload": {"order": event.offset}}, "/counted")


@app.actor("ticker", filter=Filter(types=["tick.start"], streams="/ticks", key="payload.k"), timeout_s=10)
async def ticker(ctx, event):
    # Journaled per queue row: a repeated run neither appends nor schedules twice.
    await ctx.append({"type": "ticked", "payload": {}}, "/ticked")
    await ctx.schedules.upsert("next", after_s=TICK_S, event={"type": "tick"})
