"""An order pipeline: a portal takes orders, a keyed actor runs each order,
a singleton charges payments, a schedule ships, a statistics actor keeps a
SQL table, and a conversation tells the customer.

Run it with ``make run`` (``yoke serve --app yoke.examples.orders:app``), then::

    curl -X POST localhost:8080/v1/portals/shop/orders \
         -d '{"order_id": "A-1", "items": ["tea", "cups"], "total": 42}'
    yoke read /orders/A-1          # order.placed, payment.captured, order.shipped
    yoke instances list            # one "order" instance per order id, plus the singletons

See the README's tour.
"""

from __future__ import annotations

from yoke import App, Filter, InvalidInput

app = App(version="orders-1")
SHIP_AFTER_S = 2.0


@app.portal("shop")
async def shop(ctx, request):
    """POST /v1/portals/shop/orders {"order_id", "items", "total"} -> 202."""
    if request.method != "POST" or request.path != "/orders":
        return 404, {"error": {"code": "not_found", "message": "POST /orders"}}
    order = request.json()
    if not isinstance(order, dict) or not isinstance(order.get("order_id"), str):
        raise InvalidInput("an order needs an order_id string", field="order_id")
    appended = await ctx.append(
        {
            "type": "order.placed",
            "payload": {"order_id": order["order_id"], "items": order.get("items", []),
                        "total": order.get("total", 0)},
            "correlation": order["order_id"],
            "idempotency_key": f"order:{order['order_id']}",  # a resubmitted order is not placed twice
        },
        stream=f"/orders/{order['order_id']}",
    )
    return 202, {"order_id": order["order_id"], "offset": appended["offset"]}


# One instance per order id, created by its first event.
@app.actor(
    "order",
    filter=Filter(types=["order.placed", "payment.captured"], streams=["/orders/*"], key="payload.order_id"),
    max_attempts=5,
)
async def order(ctx, event):
    order_id = ctx.instance.key
    if event.type == "order.placed":
        await ctx.state.set({"status": "placed", "total": event.payload["total"]})
        await ctx.append(
            {"type": "payment.requested", "payload": {"order_id": order_id, "amount": event.payload["total"]},
             "correlation": order_id},
            stream="/payments",
        )
    elif event.type == "payment.captured":
        await ctx.state.update(lambda s: {**s, "status": "paid"})
        await ctx.schedules.upsert("ship", after_s=SHIP_AFTER_S, event={"type": "order.ship"})
    elif event.type == "order.ship":  # sent by the schedule, straight to this instance
        await ctx.state.update(lambda s: {**s, "status": "shipped"})
        await ctx.append({"type": "order.shipped", "payload": {"order_id": order_id},
                          "correlation": order_id}, stream=f"/orders/{order_id}")
        await ctx.conversations.post_message(f"order-{order_id}", "system", f"Order {order_id} has shipped.")


# One payments desk per tenant; charges are idempotent by order id.
@app.actor("payments", filter=Filter(types=["payment.requested"], streams=["/payments"]), singleton=True)
async def payments(ctx, event):
    order_id = event.payload["order_id"]
    await ctx.append(
        {"type": "payment.captured", "payload": {"order_id": order_id, "amount": event.payload["amount"]},
         "correlation": order_id, "idempotency_key": f"capture:{order_id}"},
        stream=f"/orders/{order_id}",
    )


# Counts per event type in a SQL table of its own.
@app.actor("stats", filter=Filter(types=["order.*"]), singleton=True)
async def stats(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS counts (type TEXT PRIMARY KEY, n INTEGER NOT NULL)")
    await ctx.sqlite.exec(
        "INSERT INTO counts VALUES (?, 1) ON CONFLICT (type) DO UPDATE SET n = n + 1", [event.type]
    )
