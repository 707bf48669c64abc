// A whole Yoke application in TypeScript (docs/basics/typescript.md): a
// cart per customer, a count of changes, and an archive of them, served
// with `yoke serve --app examples/node/dist/shop.js` once `make npm`
// compiled it. Its tests (shop.test.mjs, node:test) start the real engine
// with the package's test kit.

import type { AppDefinition, Context, YokeEvent } from "../../yoke/hosts/node/yoke.js";

interface ItemAdded {
  cart: string;
  sku: string;
  qty: number;
}

type Cart = Record<string, number>;

// A cart holds at most this many of one item: more is refused (and
// dead-lettered, so the failures inbox shows it).
const MAX_QTY = 100;

export default {
  name: "shop",
  version: "shop-1",
  actors: {
    cart: {
      filter: { types: ["item.added"], streams: ["/carts/*"], where: "payload.qty > 0", key: "payload.cart" },
      max_attempts: 1,
      process: async (ctx: Context<ItemAdded>, event: YokeEvent<ItemAdded>): Promise<void> => {
        const { sku, qty } = event.payload;
        console.log(`adding ${qty} x ${sku}`);
        const cart = await ctx.state.update<Cart>((c) => ({ ...c, [sku]: (c[sku] ?? 0) + qty }), {});
        if (cart[sku] > MAX_QTY) throw new Error(`at most ${MAX_QTY} of ${sku} in a cart`);
        await ctx.append({ type: "cart.changed", payload: { cart: ctx.instance.key, items: cart } }, "/changes");
      },
    },
    changes: {
      filter: { types: ["cart.changed"], streams: ["/changes"] },
      singleton: true,
      process: async (ctx: Context): Promise<void> => {
        await ctx.state.update<{ seen: number }>((s) => ({ seen: s.seen + 1 }), { seen: 0 });
      },
    },
  },
  subscriptions: [{ source: "/changes", name: "archive", receiver: { kind: "copy", target: "/archive" }, start: "beginning" }],
} satisfies AppDefinition;
