"""The application of tests/tracing: one billing step written four ways
(in process, in a Python host process, in the Node host, there with
@opentelemetry/api), each failing its
first attempt and then appending an invoice that names the trace its
handler ran in; and ``journaled``, which appends before failing once, so
its retry's append is answered from the journal."""

from __future__ import annotations

import math
from pathlib import Path

from opentelemetry import trace

from yoke import App

ORDERS = {"types": ["order.placed"]}
RETRY = {"max_attempts": 3, "retry_base_s": 0.01, "retry_max_s": 0.02, "timeout_s": 10}

app = App()


async def bill(ctx, event):  # noqa: ANN001, ANN201
    seen = trace.get_current_span().get_span_context()
    if ctx.attempt == 1:
        raise RuntimeError("card declined")
    await ctx.append(
        {"type": "invoice.sent", "payload": {"order": event.payload["order"], "seen": f"{seen.trace_id:032x}"}},
        stream="/invoices",
    )


app.actor("billing", filter=ORDERS, **RETRY)(bill)
app.actor("billing_host", filter=ORDERS, isolation="process", **RETRY)(bill)
app.node_actor("billing_node", Path(__file__).parent / "billing.mjs", filter=ORDERS, **RETRY)
# With @opentelemetry/api in the application (tests/tracing/node, installed by make npm).
app.node_actor("billing_node_otel", Path(__file__).parent / "node" / "billing_otel.mjs", filter=ORDERS, **RETRY)


@app.actor("journaled", filter=ORDERS, **RETRY)
async def journaled(ctx, event):  # noqa: ANN001, ANN201
    await ctx.append({"type": "invoice.sent", "payload": {"order": event.payload["order"]}}, stream="/invoices")
    if ctx.attempt == 1:
        raise RuntimeError("lost the answer")


FRAGILE = {"broken": True}  # the redrive test mends it


@app.actor("fragile", filter=ORDERS, max_attempts=1, timeout_s=10)
async def fragile(ctx, event):  # noqa: ANN001, ANN201
    if FRAGILE["broken"]:
        raise RuntimeError("not yet")
    # The sign of x as the run got it: a redrive must keep the event's -0.0.
    sign = math.copysign(1, event.payload.get("x", 1.0))
    await ctx.append({"type": "invoice.sent", "payload": {"order": event.payload["order"], "sign": sign}},
                     stream="/invoices")
