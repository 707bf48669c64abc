// ctx.now() in the Node host: the runtime's clock (tests/testing/app.py).
export async function process(ctx, event) {
  await ctx.state.set({ now: ctx.now().toISOString() });
}
