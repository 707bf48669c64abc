"""SQLite values through both hosts (tests/actors/test_host_sqlite_values.py):
``py`` (a Python host process) and ``js`` (tests/actors/node/sqlite_values.mjs)
each store the event's values (tagged as yoke/hosts/wire.py tags them) in a
table, read them back, and keep what they read in their state, tagged
again; ``bad`` records how a failing op and an unencodable param reach it."""

from __future__ import annotations

from pathlib import Path

from yoke import App, Filter, YokeError
from yoke.hosts.wire import sql_from_wire, sql_to_wire

app = App()
VALUES = Filter(types=["values"], key="payload.who")


@app.actor("py", filter=VALUES, isolation="process", timeout_s=20)
async def py(ctx, event):  # noqa: ANN001, ANN201
    values = [sql_from_wire(v) for v in event.payload["values"]]
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS v (n INTEGER PRIMARY KEY, x)")
    for n, x in enumerate(values):
        await ctx.sqlite.exec("INSERT INTO v VALUES (?, ?)", [n, x])
    rows = await ctx.sqlite.query("SELECT x, typeof(x) AS t FROM v ORDER BY n")
    await ctx.state.set({"back": [sql_to_wire(r["x"]) for r in rows], "types": [r["t"] for r in rows]})


app.node_actor("js", Path(__file__).parent / "node" / "sqlite_values.mjs", filter=VALUES, timeout_s=20)


@app.actor("bad_py", filter=Filter(types=["bad"], key="payload.who"), isolation="process", timeout_s=20)
async def bad_py(ctx, event):  # noqa: ANN001, ANN201
    try:
        await ctx.sqlite.query("SELECT CAST(x'ff' AS TEXT) AS t")
        await ctx.state.set({"error": None})
    except YokeError as exc:
        await ctx.state.set({"error": exc.code})


app.node_actor("bad_js", Path(__file__).parent / "node" / "sqlite_values.mjs",
               filter=Filter(types=["bad"], key="payload.who"), timeout_s=20)
