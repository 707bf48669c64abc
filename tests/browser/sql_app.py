"""The application the console's SQL page test serves (``yoke serve --app
tests.browser.sql_app:app``).

- ``order`` (one instance per customer, keyed by ``payload.customer``) keeps
  the orders of each ``order.batch`` event in its own SQLite table
  ``orders`` (n, status, total) and counts the batches in its state.
"""

from __future__ import annotations

from yoke import App, Filter

app = App()


@app.actor("order", filter=Filter(types=["order.*"], key="payload.customer"))
async def order(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS orders (n INTEGER PRIMARY KEY, status TEXT, total INTEGER)")
    for item in event.payload["orders"]:
        await ctx.sqlite.exec("INSERT OR REPLACE INTO orders VALUES (?, ?, ?)", [item["n"], item["status"], item["total"]])
    await ctx.state.update(lambda s: {"batches": (s or {}).get("batches", 0) + 1})
