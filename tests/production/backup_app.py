"""The application of test_backup_sqlite.py: atomic actors that count.

``counter`` (one instance per key ``k``) counts its ticks in ``ctx.state``
and appends ``counted`` with the new count to ``/counted/<k>``; ``stats``
counts every tick. Both are atomic (docs/advanced/effects.md): each tick's state
write and append happen once, so after a restore the counts must equal the
ticks exactly."""

from __future__ import annotations

from yoke import App, Filter

app = App(version="backup-1")


def plus_one(state: dict) -> dict:
    return {"n": state.get("n", 0) + 1}


@app.actor("counter", filter=Filter(types=["tick"], streams=["/ticks"], key="payload.k"), effects="atomic")
async def counter(ctx, event):
    state = await ctx.state.update(plus_one)
    await ctx.append({"type": "counted", "payload": {"n": state["n"], "i": event.payload["i"]}},
                     stream=f"/counted/{ctx.instance.key}")


@app.actor("stats", filter=Filter(types=["tick"], streams=["/ticks"]), singleton=True, effects="atomic")
async def stats(ctx, event):
    await ctx.state.update(plus_one)
