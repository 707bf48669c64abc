// A Node actor for tests/actors/test_forks.py: keeps the numbers its runs
// draw with ctx.random(), which a fork replays.
export async function process(ctx, event) {
  const drawn = [ctx.random(), ctx.random()];
  await ctx.state.update((s) => ({ ...s, luck: [...(s.luck ?? []), ...drawn] }));
}
