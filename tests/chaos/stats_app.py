"""The application of test_state_home.py's workers: one ``stats`` instance
counting ``tick`` events twice over, in ``ctx.state`` and in a table of its
own (``ctx.sqlite``), as yoke/examples/orders.py's statistics actor does."""

from __future__ import annotations

from yoke import App, Filter

app = App()


@app.actor("stats", filter=Filter(types=["tick"]), singleton=True, timeout_s=5)
async def stats(ctx, event):  # noqa: ANN001
    await ctx.state.update(lambda s: {"ticks": (s or {}).get("ticks", 0) + 1})
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS ticks (id TEXT PRIMARY KEY)")
    await ctx.sqlite.exec("INSERT OR IGNORE INTO ticks VALUES (?)", [event.id])
