// The shop's tests (shop.ts), with node:test and the package's test kit:
// the real engine (`yoke serve --dev`) on a temporary SQLite file.
// Run: YOKE_BIN=.venv/bin/yoke node --test examples/node/shop.test.mjs
// (make test runs it: tests/actors/test_node_client.py).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";
import { YokeClient } from "../../yoke/hosts/node/client.js";
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

test("a tail whose connection drops resumes after the last event it gave", async () => {
  // A fetch that cuts the first tail connection right after its first event.
  let cut = false;
  let resumedWith = null;
  const dropping = async (url, init) => {
    const response = await fetch(url, init);
    if (!String(url).includes("/-/tail")) return response;
    if (cut) {
      resumedWith ??= init.headers["last-event-id"];
      return response;
    }
    cut = true;
    const reader = response.body.getReader();
    let text = "";
    const body = new ReadableStream({
      async pull(controller) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        text += new TextDecoder().decode(value);
        const end = text.indexOf("\n\n", text.indexOf("data:"));
        if (text.includes("data:") && end >= 0) {
          controller.enqueue(new TextEncoder().encode(text.slice(0, end + 2)));
          reader.cancel();
          controller.error(new Error("connection reset"));
        }
      },
    });
    return new Response(body, { status: response.status, headers: response.headers });
  };
  const client = new YokeClient({ url: yoke.url, fetch: dropping });
  const stream = "/drops";
  for (const n of [1, 2, 3]) await client.append(stream, { type: "tick", payload: { n } });
  const controller = new AbortController();
  const seen = [];
  for await (const event of client.tail(stream, { after: 0, signal: controller.signal })) {
    seen.push(event.payload.n);
    if (seen.length === 3) break;
  }
  assert.ok(cut);
  assert.deepEqual(seen, [1, 2, 3]); // none lost, none twice
  assert.equal(resumedWith, "1"); // the second connection asked for what followed the first event
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
