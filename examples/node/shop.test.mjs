// The shop's tests (shop.ts), with node:test and the package's test kit:
// the real engine (`yoke serve --dev`) on a temporary SQLite file.
// Run: YOKE_BIN=.venv/bin/yoke node --test examples/node/shop.test.mjs
// (make test runs it: tests/actors/test_node_client.py).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { startYoke } from "../../yoke/hosts/node/testing.js";

const app = fileURLToPath(new URL("./dist/shop.js", import.meta.url));
let yoke;

before(async () => {
  yoke = await startYoke({ app, env: { YOKE_HOST_PROCESSES: "1" } });
});

after(async () => {
  await yoke?.stop();
});

test("items go into their customer's cart, once each", async () => {
  const { client } = yoke;
  await client.append("/carts/ann", { type: "item.added", payload: { cart: "ann", sku: "tea", qty: 2 } });
  const retried = { type: "item.added", payload: { cart: "ann", sku: "jam", qty: 1 } };
  const first = await client.append("/carts/ann", retried, { idempotencyKey: "order-7" });
  const again = await client.append("/carts/ann", retried, { idempotencyKey: "order-7" });
  assert.equal(again.offset, first.offset); // a retried POST appends nothing new
  await client.appendBatch("/carts/bob", [
    { type: "item.added", payload: { cart: "bob", sku: "tea", qty: 1 } },
    { type: "item.added", payload: { cart: "bob", sku: "tea", qty: 0 } }, // the filter's where: not routed
  ]);
  await yoke.idle();
  assert.deepEqual(await yoke.state("cart", "ann"), { tea: 2, jam: 1 });
  assert.deepEqual(await yoke.state("cart", "bob"), { tea: 1 });
  const [changes] = await client.instances.list({ actor: "changes" });
  assert.deepEqual((await client.instances.get(changes.instance_id)).state.value, { seen: 3 });
});

test("a tail sees the changes as they come, and reads page by page", async () => {
  const controller = new AbortController();
  const { head } = await client_head("/changes");
  const seen = [];
  const tailing = (async () => {
    for await (const event of yoke.client.tail("/changes", { after: head, signal: controller.signal })) {
      seen.push(event.payload.cart);
      if (seen.length === 2) controller.abort();
    }
  })().catch((err) => { if (!controller.signal.aborted) throw err; });
  await yoke.client.append("/carts/cy", { type: "item.added", payload: { cart: "cy", sku: "tea", qty: 1 } });
  await yoke.client.append("/carts/di", { type: "item.added", payload: { cart: "di", sku: "tea", qty: 1 } });
  await tailing;
  assert.deepEqual(seen.sort(), ["cy", "di"]);
  const all = [];
  for await (const event of yoke.client.readAll("/changes", { limit: 2 })) all.push(event.offset);
  assert.deepEqual(all, [...all].sort((a, b) => a - b));
  assert.ok(all.length >= 5);
});

test("a refused item is dead-lettered with its stack and what the run printed", async () => {
  await yoke.client.append("/carts/ed", { type: "item.added", payload: { cart: "ed", sku: "tea", qty: 101 } });
  await yoke.idle();
  const [failure] = await yoke.failures({ actor: "cart" });
  assert.match(failure.error, /at most 100 of tea/);
  const full = await yoke.client.failures.get(failure.id);
  assert.match(full.traceback, /shop\.ts:\d+/); // source maps: the TypeScript line
  assert.match(full.traceback, /adding 101 x tea/);
});

async function client_head(stream) {
  const page = await yoke.client.read(stream, { after: 0, limit: 1000 });
  return { head: page.events.length ? page.events[page.events.length - 1].offset : 0 };
}
