"""Applications of tests/actors/test_forks.py (``app``, and ``fixed_app``: the
same actors with a fix for the poisoned event and a different rounding).

``order`` (keyed by payload.id) does a bit of everything a fork replays:
its own table and state (with ctx.now() and ctx.random()), an append, a
schedule, a child instance, a conversation message and a portal call.
``order_atomic`` is the same in atomic mode; ``clock`` stores time.time()
(not through ctx: a fork sees it differ)."""

from __future__ import annotations

import time

from yoke import App, Filter


def build(fixed: bool) -> App:
    app = App()

    @app.portal("pricing")
    async def pricing(ctx, request):
        return None

    @pricing.method("quote")
    async def quote(ctx, params):
        return {"price": 3 * params["qty"]}

    async def order(ctx, event):
        p = event.payload
        qty = int(p.get("qty", 1))
        quote = await ctx.portals.call("pricing", "quote", {"qty": qty})
        if p.get("poison") and not fixed:
            raise ValueError("poisoned line")
        await ctx.sqlite.exec(
            "CREATE TABLE IF NOT EXISTS lines (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL, price INTEGER)"
        )
        price = quote["price"] if not fixed else quote["price"] + 1
        await ctx.sqlite.exec(
            "INSERT INTO lines VALUES (?, ?, ?) ON CONFLICT (sku) DO UPDATE SET qty = qty + excluded.qty,"
            " price = excluded.price", [p.get("sku", "none"), qty, price],
        )
        await ctx.state.update(lambda s: {
            **s, "lines": s.get("lines", 0) + 1, "last_at": ctx.now().isoformat(), "luck": ctx.random(),
        }, default={})
        await ctx.append({"type": "line.priced", "payload": {"sku": p.get("sku"), "price": price}}, stream="/priced")
        if p.get("remind"):
            await ctx.schedules.upsert("remind", after_s=3600, event={"type": "order.remind"})
        if p.get("ship"):
            await ctx.instances.create("shipment", config={"order": p["id"]})
            await ctx.conversations.post_message(f"order-{p['id']}", "bot", {"text": "shipping"})

    app.actor("order", filter=Filter(types=["order.line"], key="payload.id"), max_attempts=2, retry_base_s=0.01,
              retry_max_s=0.02)(order)
    app.actor("order_atomic", filter=Filter(types=["atomic.line"], key="payload.id"), max_attempts=2,
              retry_base_s=0.01, retry_max_s=0.02, effects="atomic")(order)

    @app.actor("shipment")
    async def shipment(ctx, event):
        pass

    @app.actor("clock", filter=Filter(types=["clock.tick"], key="payload.id"))
    async def clock(ctx, event):
        await ctx.state.set({"seen_at": time.time()})

    @app.actor("bounded", filter=Filter(types=["bounded.line"], key="payload.id"), keep_inputs=1)
    async def bounded(ctx, event):
        await ctx.state.update(lambda s: {"n": s.get("n", 0) + 1}, default={})

    return app


app = build(fixed=False)
fixed_app = build(fixed=True)
