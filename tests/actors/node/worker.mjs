// A Node actor for tests/actors/test_node_host.py: does what the event's
// payload says, so one script covers the ctx surface and every way a
// handler can end (return, throw, exit, be killed, spin, allocate).

import nodeProcess from "node:process";

export async function process(ctx, event) {
  const what = event.payload.what;
  if (what === "raise") throw new TypeError("asked to fail");
  if (what === "exit") nodeProcess.exit(7);
  if (what === "kill") nodeProcess.kill(nodeProcess.pid, "SIGKILL");
  if (what === "spin") for (;;);
  if (what === "allocate") for (const hoard = []; ; ) hoard.push(new Array(1e5).fill(what));
  if (what === "flaky" && ctx.attempt === 1) {
    await ctx.state.set({ firstKey: ctx.idempotencyKey("pay") });
    throw new Error("first attempts fail");
  }
  if (what === "op-error") {
    try {
      await ctx.append({ type: "" });
    } catch (err) {
      await ctx.state.set({ caught: { name: err.name, code: err.code, message: err.message } });
      return;
    }
  }
  if (what === "surface") {
    await ctx.state.set({ n: 1 });
    const before = await ctx.state.get();
    const version = await ctx.state.version();
    // Concurrent updates of one instance in one host: none is lost.
    await Promise.all([1, 2, 3].map(() => ctx.state.update((s) => ({ ...s, n: s.n + 1 }))));
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS seen (offset_ INTEGER PRIMARY KEY, type TEXT)");
    const { rowcount } = await ctx.sqlite.exec("INSERT INTO seen VALUES (?, ?)", [event.offset, event.type]);
    const rows = await ctx.sqlite.query("SELECT offset_, type FROM seen WHERE offset_ = :o", { o: event.offset });
    const appended = await ctx.append({ type: "node.did", payload: { key: ctx.instance.key } }, "/out");
    await ctx.state.update((s) => ({
      ...s, before, version, rowcount, rows, appended, attempt: ctx.attempt, tenant: ctx.tenant,
      instance: ctx.instance, event: ctx.event, pid: nodeProcess.pid,
      frozen: Object.isFrozen(ctx),
    }));
    return;
  }
  await ctx.state.update((s) => ({
    ...s, done: (s.done ?? 0) + 1, attempt: ctx.attempt, pid: nodeProcess.pid, key: ctx.idempotencyKey("pay"),
  }));
}
