// What the types must refuse: each line marked below fails to compile (the
// directive makes tsc fail if one does not).

import type { Context, YokeEvent } from "yoke-sdk";

interface Txn {
  account: string;
  cents: number;
}

export async function process(ctx: Context<Txn>, event: YokeEvent<Txn>): Promise<void> {
  // @ts-expect-error: an op name with a typo
  await ctx.call("schedule_upsert", {});
  // @ts-expect-error: an op's params of the wrong shape
  await ctx.call("schedules_cancel", { nam: "x" });
  // @ts-expect-error: a schedule needs its event
  await ctx.schedules.upsert("x", { after_s: 5 });
  // @ts-expect-error: the payload is a Txn
  const who: number = event.payload.account;
  // @ts-expect-error: an event needs a type
  await ctx.append({ payload: {} });
  // @ts-expect-error: SQLite takes no objects
  await ctx.sqlite.exec("INSERT INTO t VALUES (?)", [{ a: 1 }]);
  void who;
}
