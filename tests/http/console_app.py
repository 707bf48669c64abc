"""The application the console's API and browser tests serve
(``yoke serve --app tests.http.console_app:app``).

- ``ledger`` (one per tenant) keeps ``ledger.*`` events in a table of its own SQLite database
  (``entries``), counts them in its state and keeps a daily cron schedule;
- ``flaky`` (one per tenant) fails on ``flaky.fail`` events until a ``flaky.heal`` event
  reached the instance (2 attempts, fast retries): a dead row succeeds once
  redriven after a heal.
"""

from __future__ import annotations

from yoke import App, Filter

app = App()


@app.actor("ledger", filter=Filter(types=["ledger.*"]), singleton=True)
async def ledger(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS entries (offset INTEGER PRIMARY KEY, type TEXT, amount)")
    payload = event.payload if isinstance(event.payload, dict) else {}
    await ctx.sqlite.exec(
        "INSERT OR REPLACE INTO entries VALUES (?, ?, ?)", [event.offset, event.type, payload.get("amount")]
    )
    await ctx.state.update(lambda s: {"entries": (s or {}).get("entries", 0) + 1, "last": event.type})
    await ctx.schedules.upsert("daily-total", cron="0 9 * * *", event={"type": "ledger.total", "payload": {}})


@app.actor("flaky", filter=Filter(types=["flaky.*"]), singleton=True, max_attempts=2, retry_base_s=0.01, retry_max_s=0.05)
async def flaky(ctx, event):
    state = await ctx.state.get({})
    if event.type == "flaky.heal":
        await ctx.state.set({**state, "healed": True})
        return
    if event.type == "flaky.fail" and not state.get("healed"):
        raise RuntimeError(f"flaky refuses {event.payload}")
    await ctx.state.set({**state, "done": state.get("done", 0) + 1})
