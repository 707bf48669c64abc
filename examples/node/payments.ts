// The payments desk of yoke/examples/orders.py in TypeScript, run by Yoke's Node
// host (examples/orders_node.py registers it with app.node_actor). Like the
// Python one it captures each requested payment, idempotently by order id;
// it also keeps its books: a row per charge in its own SQLite table and a
// ledger in its state document, both safe to run twice (a retried event).
//
// Compiled to dist/payments.js by `make npm` (tsc, pinned in package.json).

import type { Context, YokeEvent } from "../../yoke/hosts/node/yoke.js";

type PaymentRequested = { order_id: string; amount: number };
type Ledger = { paid: Record<string, number>; total: number };

export async function process(ctx: Context, event: YokeEvent<PaymentRequested>): Promise<void> {
  const { order_id, amount } = event.payload;
  await ctx.append(
    {
      type: "payment.captured",
      payload: { order_id, amount },
      correlation: order_id,
      idempotency_key: `capture:${order_id}`, // a retried run does not capture twice
    },
    `/orders/${order_id}`,
  );
  await ctx.sqlite.exec(
    "CREATE TABLE IF NOT EXISTS charges (order_id TEXT PRIMARY KEY, amount REAL NOT NULL, event_offset INTEGER NOT NULL)",
  );
  await ctx.sqlite.exec("INSERT INTO charges VALUES (?, ?, ?) ON CONFLICT (order_id) DO NOTHING", [
    order_id,
    amount,
    event.offset,
  ]);
  await ctx.state.update<Ledger>(
    (ledger) => {
      const paid = { ...ledger.paid, [order_id]: amount };
      return { paid, total: Object.values(paid).reduce((sum, n) => sum + n, 0) };
    },
    { paid: {}, total: 0 },
  );
}
