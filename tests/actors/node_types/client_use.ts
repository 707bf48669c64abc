// The package's client and test kit, typed (compiled by tests/actors/test_node_types.py).

import { YokeClient } from "yoke-sdk/client";
import { startYoke } from "yoke-sdk/testing";
import type { YokeEvent } from "yoke-sdk";

interface Order {
  id: string;
  cents: number;
}

export async function demo(): Promise<number> {
  const yoke = await startYoke({ app: "dist/app.js" });
  const client: YokeClient = yoke.client;
  const sent = await client.append<Order>("/orders", { type: "order.placed", payload: { id: "o1", cents: 5 } }, { idempotencyKey: "o1" });
  const page = await client.read<Order>("/orders", { after: 0 });
  const first: YokeEvent<Order> | undefined = page.events[0];
  for await (const event of client.tail<Order>("/orders", { after: sent.offset, signal: AbortSignal.timeout(1000) })) {
    return event.payload.cents + (first?.payload.cents ?? 0);
  }
  const state = await yoke.state<{ seen: number }>("orders", "o1");
  await yoke.stop();
  return state?.seen ?? 0;
}
