"""Subscription billing, built from the README and the docs alone.

- A portal, ``POST /v1/portals/billing``, takes customer events and appends
  each to the customer's stream ``/customers/<customer>`` with an idempotency
  key, so a retried POST appends once.
- A keyed ``customer`` actor (one instance per customer, created by its first
  event) in atomic mode keeps the customer's subscription, metered usage and
  invoices in SQLite tables of its own (``ctx.sqlite``), and a monthly
  schedule (cron, the 1st of each month, 00:00 UTC) that closes the period.
- Closing a period appends ``invoice.issued`` to ``/invoices``; a subscription
  declared on the App posts each invoice to a webhook, signed per Standard
  Webhooks with the secret in ``BILLING_WEBHOOK_SECRET``.

Run it from the repository root::

    export BILLING_WEBHOOK_SECRET=whsec_$(head -c 24 /dev/urandom | base64)
    export BILLING_WEBHOOK_URL=http://127.0.0.1:9000/invoices
    .venv/bin/yoke serve --app examples.billing.app:app

    curl -X POST localhost:8080/v1/portals/billing -H 'Idempotency-Key: evt-1' \\
         -d '{"customer": "c1", "type": "plan.started", "plan": "pro"}'

See examples/billing/README.md.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yoke
from yoke import App, Filter, InvalidInput

# Monthly price of each plan, and of one unit of metered usage, in cents.
PLANS = {"free": 0, "pro": 2900, "team": 9900}
UNIT_PRICE_CENTS = 5
CURRENCY = "EUR"
# When a period closes: the 1st of every month, 00:00 UTC.
CLOSE_PERIOD_CRON = "0 0 1 * *"

# What the portal takes from outside, and what the customer actor handles
# (billing.close_period also comes from its schedule, straight to it).
CUSTOMER_EVENTS = ["plan.started", "plan.cancelled", "usage.recorded", "billing.close_period"]
CUSTOMER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def make_app(webhook_url: str, *, secret_env: str = "BILLING_WEBHOOK_SECRET") -> App:
    """The billing service, posting its invoices to ``webhook_url``."""
    app = App(name="billing", version="billing-1")

    # Invoices go to the accounting system's webhook. Declared here, the
    # subscription is created (or brought in line) whenever the service starts.
    app.subscription(
        "/invoices", "billing-hook",
        yoke.webhook(webhook_url, secret=yoke.secret_from_env(secret_env)),
        filter={"types": ["invoice.issued"]},
    )

    @app.portal("billing")
    async def billing(ctx, request):
        """POST /v1/portals/billing {"customer", "type", ...} -> 202.

        The idempotency key is the ``Idempotency-Key`` header, else the
        body's ``id``: a retried POST appends nothing new and answers the
        original offset."""
        if request.method != "POST" or request.path != "/":
            return 404, {"error": {"code": "not_found", "message": "POST /v1/portals/billing"}}
        body = request.json()
        if not isinstance(body, dict):
            raise InvalidInput("the body is a JSON object")
        customer = body.get("customer")
        if not isinstance(customer, str) or not CUSTOMER_ID.fullmatch(customer):
            raise InvalidInput("customer: 1-64 letters, digits, '_' or '-'", field="customer")
        key = request.headers.get("idempotency-key") or body.get("id")
        if not isinstance(key, str) or not 1 <= len(key) <= 200:
            raise InvalidInput("an Idempotency-Key header (or an id in the body) is required", field="id")
        kind = body.get("type")
        payload: dict[str, Any] = {"customer": customer}
        if kind == "plan.started":
            if body.get("plan") not in PLANS:
                raise InvalidInput(f"plan is one of {sorted(PLANS)}", field="plan")
            payload["plan"] = body["plan"]
        elif kind == "usage.recorded":
            units = body.get("units")
            if not isinstance(units, int) or isinstance(units, bool) or units < 0:
                raise InvalidInput("units is a whole number, 0 or more", field="units")
            payload["units"] = units
        elif kind not in ("plan.cancelled", "billing.close_period"):
            raise InvalidInput(f"type is one of {CUSTOMER_EVENTS}", field="type")
        appended = await ctx.append(
            {"type": kind, "payload": payload, "correlation": customer, "idempotency_key": f"billing:{key}"},
            stream=f"/customers/{customer}",
        )
        return 202, {"customer": customer, "offset": appended["offset"]}

    # One instance per customer. Atomic: each event's table writes, schedule
    # changes and appended invoice become visible together, exactly once.
    @app.actor(
        "customer",
        filter=Filter(types=CUSTOMER_EVENTS, streams=["/customers/*"], key="payload.customer"),
        effects="atomic",
    )
    async def customer(ctx, event):
        db = ctx.sqlite
        await create_tables(db)
        if event.type == "plan.started":
            plan = event.payload["plan"]
            await db.exec(
                "INSERT INTO subscription (id, plan, status, period_start) VALUES (1, ?, 'active', ?)"
                " ON CONFLICT (id) DO UPDATE SET plan = excluded.plan, status = 'active'",
                [plan, event.at],
            )
            await ctx.schedules.upsert(
                "close-period", cron=CLOSE_PERIOD_CRON,
                event={"type": "billing.close_period", "payload": {"customer": ctx.instance.key}},
            )
        elif event.type == "usage.recorded":
            await db.exec("INSERT INTO usage (event_id, at, units) VALUES (?, ?, ?)",
                          [event.id, event.at, event.payload["units"]])
        elif event.type == "billing.close_period":
            await close_period(ctx, event.at)
        elif event.type == "plan.cancelled":
            await close_period(ctx, event.at)  # the final invoice
            await db.exec("UPDATE subscription SET status = 'cancelled'")
            await ctx.schedules.cancel("close-period")

    return app


async def create_tables(db) -> None:  # noqa: ANN001
    await db.exec("CREATE TABLE IF NOT EXISTS subscription ("
                  " id INTEGER PRIMARY KEY CHECK (id = 1), plan TEXT NOT NULL, status TEXT NOT NULL,"
                  " period_start INTEGER NOT NULL)")
    await db.exec("CREATE TABLE IF NOT EXISTS usage ("
                  " event_id TEXT PRIMARY KEY, at INTEGER NOT NULL, units INTEGER NOT NULL, invoice INTEGER)")
    await db.exec("CREATE TABLE IF NOT EXISTS invoices ("
                  " number INTEGER PRIMARY KEY, period_start INTEGER NOT NULL, period_end INTEGER NOT NULL,"
                  " plan TEXT, total_cents INTEGER NOT NULL)")


async def close_period(ctx, now_ms: int) -> None:  # noqa: ANN001
    """Invoice the period that ends now: the plan's monthly price (when the
    subscription is active) plus the usage not invoiced yet. Nothing to
    charge, no invoice."""
    db = ctx.sqlite
    subscription = await db.query("SELECT plan, status, period_start FROM subscription")
    active = bool(subscription) and subscription[0]["status"] == "active"
    plan = subscription[0]["plan"] if active else None
    (usage,) = await db.query("SELECT count(*) AS n, coalesce(sum(units), 0) AS units FROM usage WHERE invoice IS NULL")
    if not active and usage["n"] == 0:
        return
    (last,) = await db.query("SELECT coalesce(max(number), 0) AS number FROM invoices")
    number = last["number"] + 1
    period_start = subscription[0]["period_start"] if subscription else now_ms
    lines = []
    if plan is not None:
        lines.append({"item": f"plan {plan}", "cents": PLANS[plan]})
    if usage["units"]:
        lines.append({"item": f"{usage['units']} units", "cents": usage["units"] * UNIT_PRICE_CENTS})
    total = sum(line["cents"] for line in lines)
    await db.exec("INSERT INTO invoices VALUES (?, ?, ?, ?, ?)", [number, period_start, now_ms, plan, total])
    await db.exec("UPDATE usage SET invoice = ? WHERE invoice IS NULL", [number])
    await db.exec("UPDATE subscription SET period_start = ?", [now_ms])
    invoice_id = f"{ctx.instance.key}-{number:04d}"
    await ctx.append(
        {
            "type": "invoice.issued",
            "payload": {"invoice": invoice_id, "customer": ctx.instance.key, "number": number,
                        "period_start": period_start, "period_end": now_ms, "lines": lines,
                        "total_cents": total, "currency": CURRENCY},
            "correlation": ctx.instance.key,
            "idempotency_key": f"invoice:{invoice_id}",
        },
        stream="/invoices",
    )


# What `yoke serve --app examples.billing.app:app` runs: the webhook's URL is
# read when the module is imported, its secret when the service starts.
app = make_app(os.environ.get("BILLING_WEBHOOK_URL", "http://127.0.0.1:9000/invoices"))
