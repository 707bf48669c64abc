// Ordinary TypeScript against the SDK's types: interfaces, generics, the
// typed ops. Compiled with tsc --strict by tests/actors/test_node_types.py
// (in a project that installed the packed yoke-sdk), then run as an actor.

import { YokeError } from "yoke-sdk";
import type { Context, Process, YokeEvent } from "yoke-sdk";

interface Txn {
  account: string;
  cents: number;
}

interface Balance {
  cents: number;
  last: string | null;
}

export const process: Process<Txn> = async (ctx: Context<Txn>, event: YokeEvent<Txn>): Promise<void> => {
  const balance = await ctx.state.update<Balance>((b) => ({ cents: b.cents + event.payload.cents, last: event.id }), {
    cents: 0,
    last: null,
  });
  await ctx.append({ type: "balance.changed", payload: balance, correlation: null, source: { by: "ts" } }, "/balances");
  const due = await ctx.schedules.upsert("statement", { event: { type: "statement.due" }, at: new Date(Date.now() + 86_400_000) });
  const child = await ctx.instances.create("ledger", { key: event.payload.account });
  const answered = await ctx.call("schedules_list", {});
  let code = "";
  try {
    await ctx.call("stream_append", { event: { type: "" }, stream: "/balances" });
  } catch (err) {
    if (err instanceof YokeError) code = err.code; // the host's error, this package's class
  }
  await ctx.state.set<Balance & { child: string; due_at: number; schedules: number; refused: string }>({
    ...balance,
    child: child.instance_id,
    due_at: due.due_at,
    schedules: answered.length,
    refused: code,
  });
};
