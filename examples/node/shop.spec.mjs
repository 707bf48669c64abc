// The shop's tests under Vitest (globals: test, expect, beforeAll,
// afterAll), with the same test kit as shop.test.mjs (node:test).
// Run: YOKE_BIN=.venv/bin/yoke vitest run --globals --root examples/node shop.spec.mjs
// (make test runs it: tests/actors/test_node_client.py).

import { fileURLToPath } from "node:url";
import { startYoke } from "../../yoke/hosts/node/testing.js";

const app = fileURLToPath(new URL("./dist/shop.js", import.meta.url));
let yoke;

beforeAll(async () => {
  yoke = await startYoke({ app, env: { YOKE_HOST_PROCESSES: "1" } });
}, 60_000);

afterAll(async () => {
  await yoke?.stop();
});

test("items go into their customer's cart", async () => {
  await yoke.client.append("/carts/ann", { type: "item.added", payload: { cart: "ann", sku: "tea", qty: 2 } });
  await yoke.client.append("/carts/ann", { type: "item.added", payload: { cart: "ann", sku: "tea", qty: 3 } });
  await yoke.idle();
  expect(await yoke.state("cart", "ann")).toEqual({ tea: 5 });
  expect(await yoke.failures()).toEqual([]);
});
