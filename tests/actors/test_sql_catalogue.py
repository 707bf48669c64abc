"""The SQL catalogue end to end (docs/advanced/sql.md), on both backends:
instances' tables and state as a run leaves them, checked against each
instance's own database; a run seen whole; a schema change without a
restart; removal; repair of a mirror left behind; atomic runs; row-level
security as the runtime's role."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import asyncpg
import pytest

import yoke
from yoke import App, Filter

T = "acme"


def shop() -> App:
    app = App()

    @app.actor("order", filter=Filter(types=["line", "migrate", "clear"], key="payload.order"))
    async def order(ctx, event):
        p = event.payload
        if event.type == "migrate":
            await ctx.sqlite.exec("ALTER TABLE lines ADD COLUMN note TEXT")
            await ctx.sqlite.exec("UPDATE lines SET note = 'migrated'")
            return
        if event.type == "clear":
            await ctx.sqlite.exec("DELETE FROM lines")
            return
        await ctx.sqlite.exec(
            "CREATE TABLE IF NOT EXISTS lines (id INTEGER PRIMARY KEY, sku TEXT, qty INTEGER, price REAL, status TEXT)"
        )
        await ctx.sqlite.exec(
            "INSERT OR REPLACE INTO lines (id, sku, qty, price, status) VALUES (?, ?, ?, ?, ?)",
            [p["n"], p["sku"], p["qty"], p["price"], p["status"]],
        )
        await ctx.state.update(lambda s: {"lines": (s or {}).get("lines", 0) + 1})

    return app


def line(order: str, n: int, sku: str, qty: int, price: float, status: str) -> dict:
    return {"type": "line", "payload": {"order": order, "n": n, "sku": sku, "qty": qty, "price": price, "status": status}}


LINES = [
    line("A", 1, "tea", 2, 3.5, "open"), line("A", 2, "cup", 1, 9.0, "paid"),
    line("B", 1, "tea", 5, 3.5, "paid"), line("C", 1, "pot", 1, 30.0, "open"),
    line("C", 2, "tea", 1, 3.5, "open"), line("C", 3, "cup", 4, 9.0, "paid"),
]


async def settled(y: yoke.Runtime) -> None:
    await y.wait_idle(timeout_s=20)
    await y.sql_settled()


async def test_answers_match_each_instance(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append_many(LINES)
        await settled(y)
        # What each instance's own database says, added up.
        expected: Counter = Counter()
        amounts: Counter = Counter()
        for inst in await y.instances(T).list(actor="order"):
            own = await y.instances(T).query(inst.instance_id, "SELECT status, qty, price FROM lines")
            for status, qty, price in own.rows:
                expected[status] += 1
                amounts[status] += qty * price
        result = await y.sql(
            T, 'SELECT status, count(*), sum(qty * price) FROM "order".lines GROUP BY status ORDER BY status'
        )
        assert result.columns[0] == "status"
        assert [(r[0], r[1], r[2]) for r in result.rows] == sorted(
            (s, expected[s], pytest.approx(amounts[s])) for s in expected
        )
        # A join with Yoke's records, a window function and a CTE.
        joined = await y.sql(
            T,
            'SELECT i.key, count(*) FROM "order".lines JOIN yoke.instances i USING (instance_id)'
            " WHERE i.actor = 'order' GROUP BY i.key ORDER BY i.key",
        )
        assert joined.rows == [["A", 2], ["B", 1], ["C", 3]]
        ranked = await y.sql(
            T,
            "WITH t AS (SELECT key, sku, qty * price AS amount FROM \"order\".lines)"
            " SELECT key, sku, rank() OVER (PARTITION BY key ORDER BY amount DESC) FROM t ORDER BY key, 3",
        )
        assert ranked.rows[:2] == [["A", "cup", 1], ["A", "tea", 2]]
        by_key = await y.sql(T, 'SELECT sku FROM "order".lines WHERE key = ? ORDER BY sku', ["C"])
        assert by_key.rows == [["cup"], ["pot"], ["tea"]]
        # ctx.state, as instances.state reads it.
        states = await y.sql(T, 'SELECT key, value, version FROM "order".yoke_state ORDER BY key')
        assert states.rows == [["A", '{"lines":2}', 2], ["B", '{"lines":1}', 1], ["C", '{"lines":3}', 3]]


async def test_a_run_is_seen_whole(fresh_url: str, tmp_path) -> None:
    app = App()
    halfway = asyncio.Event()
    go_on = asyncio.Event()

    @app.actor("pair", filter=Filter(types=["pair"], key="payload.k"))
    async def pair(ctx, event):
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS halves (side TEXT)")
        await ctx.sqlite.exec("INSERT INTO halves VALUES ('left')")
        if event.payload.get("wait"):
            halfway.set()
            await go_on.wait()
        await ctx.sqlite.exec("INSERT INTO halves VALUES ('right')")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/", T).append({"type": "pair", "payload": {"k": "one"}})
        await settled(y)
        await y.stream("/", T).append({"type": "pair", "payload": {"k": "one", "wait": True}})
        await asyncio.wait_for(halfway.wait(), 10)
        await y.sql_settled()  # everything but the run under way is sent
        during = await y.sql(T, "SELECT side, count(*) FROM pair.halves GROUP BY side ORDER BY side")
        assert during.rows == [["left", 1], ["right", 1]]  # the first run only: nothing of the second
        go_on.set()
        await settled(y)
        after = await y.sql(T, "SELECT side, count(*) FROM pair.halves GROUP BY side ORDER BY side")
        assert after.rows == [["left", 2], ["right", 2]]


async def test_a_schema_change_shows_without_a_restart(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append_many(LINES[:3])
        await settled(y)
        before = await y.sql(T, 'SELECT * FROM "order".lines LIMIT 1')
        assert "note" not in before.columns
        await y.stream("/orders", T).append({"type": "migrate", "payload": {"order": "A"}})
        await settled(y)
        after = await y.sql(T, 'SELECT key, note FROM "order".lines ORDER BY key, id')
        # A's rows were migrated; B never had the column: NULL there.
        assert after.rows == [["A", "migrated"], ["A", "migrated"], ["B", None]]
        await y.stream("/orders", T).append({"type": "clear", "payload": {"order": "A"}})
        await settled(y)
        assert (await y.sql(T, 'SELECT key FROM "order".lines')).rows == [["B"]]


async def test_a_removed_instance_disappears(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append_many(LINES)
        await settled(y)
        a = await y.instances(T).find("order", "A")
        await y.instances(T).remove(a.instance_id)
        keys = await y.sql(T, 'SELECT DISTINCT key FROM "order".lines ORDER BY key')
        assert keys.rows == [["B"], ["C"]]
        states = await y.sql(T, 'SELECT key FROM "order".yoke_state ORDER BY key')
        assert states.rows == [["B"], ["C"]]


async def test_changes_appear_without_being_waited_for(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append_many(LINES[:1])
        await settled(y)
        await y.stream("/orders", T).append(line("A", 9, "fresh", 1, 1.0, "open"))
        await y.wait_idle(timeout_s=20)
        deadline = time.monotonic() + 5
        while True:  # the mirror's own sending, not sql_settled
            found = await y.sql(T, "SELECT count(*) FROM \"order\".lines WHERE sku = 'fresh'")
            if found.rows == [[1]] or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.01)
        assert found.rows == [[1]]


async def test_a_mirror_left_behind_is_repaired(fresh_url: str, tmp_path) -> None:
    """Changes a process committed but never sent (it died first: here
    every send fails) are sent when the instance is next opened."""
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append_many(LINES[:2])
        await settled(y)
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        async def lost(tenant, changes):
            raise ConnectionError("the process died before its send")

        y.store.catalogue.mirror = lost
        await y.stream("/orders", T).append(line("A", 3, "unsent", 1, 1.0, "open"))
        await y.wait_idle(timeout_s=20)
        stale = await y.sql(T, "SELECT count(*) FROM \"order\".lines WHERE sku = 'unsent'")
        assert stale.rows == [[0]]
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append(line("A", 4, "later", 1, 1.0, "open"))
        await settled(y)
        rows = await y.sql(T, "SELECT sku FROM \"order\".lines WHERE key = 'A' ORDER BY id")
        assert rows.rows == [["tea"], ["cup"], ["unsent"], ["later"]]


async def test_atomic_runs_show_only_what_committed(fresh_url: str, tmp_path) -> None:
    app = App()

    @app.actor("ledger", filter=Filter(types=["entry"], key="payload.k"), effects="atomic", max_attempts=2,
               retry_base_s=0.01, retry_max_s=0.01)
    async def ledger(ctx, event):
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS entries (amount INTEGER)")
        await ctx.sqlite.exec("INSERT INTO entries VALUES (?)", [event.payload["amount"]])
        if event.payload.get("fail"):
            raise RuntimeError("no")

    async with yoke.open(fresh_url, app=app, data_dir=str(tmp_path)) as y:
        await y.stream("/", T).append_many([
            {"type": "entry", "payload": {"k": "a", "amount": 5}},
            {"type": "entry", "payload": {"k": "a", "amount": 7, "fail": True}},
            {"type": "entry", "payload": {"k": "a", "amount": 11}},
        ])
        await settled(y)
        result = await y.sql(T, "SELECT sum(amount), count(*) FROM ledger.entries")
        assert result.rows == [[16, 2]]


@pytest.mark.parametrize("fresh_url", ["postgres"], indirect=True)
async def test_row_level_security_keeps_the_mirror_to_its_tenant(fresh_url: str, tmp_path) -> None:
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        await y.stream("/orders", T).append_many(LINES[:2])
        await y.stream("/orders", "other").append_many(LINES[2:4])
        await settled(y)
        assert (await y.sql("other", 'SELECT DISTINCT key FROM "order".lines ORDER BY key')).rows == [["B"], ["C"]]
    conn = await asyncpg.connect(fresh_url)
    try:
        await conn.execute("SET ROLE yoke_runtime")
        async with conn.transaction():
            await conn.execute("SELECT set_config('yoke.tenant', $1, true)", T)
            for table in ("sql_rows", "sql_instances", "sql_columns", "sql_catalogue_versions"):
                assert {r[0] for r in await conn.fetch(f"SELECT tenant_id FROM {table}")} == {T}, table
                assert await conn.fetchval(f"SELECT count(*) FROM {table} WHERE tenant_id = 'other'") == 0
    finally:
        await conn.close()


async def test_a_large_send_goes_in_bounded_transactions(fresh_url: str, tmp_path, monkeypatch) -> None:
    """Many instances changed at once are sent in transactions of bounded
    size (one transaction for thousands ran past the statement time)."""
    from yoke.actors import sql_mirror

    monkeypatch.setattr(sql_mirror, "SEND_ROWS", 5)
    async with yoke.open(fresh_url, app=shop(), data_dir=str(tmp_path)) as y:
        sizes: list[int] = []
        real = y.store.catalogue.mirror

        async def counted(tenant, changes):
            sizes.append(len(changes))
            return await real(tenant, changes)

        y.store.catalogue.mirror = counted
        await y.stream("/orders", T).append_many(
            [line(f"K{i}", 1, "tea", 1, 1.0, "open") for i in range(12)]
        )
        await settled(y)
        assert (await y.sql(T, 'SELECT count(DISTINCT key) FROM "order".lines')).rows == [[12]]
        assert sizes and max(sizes) <= 2  # about 5 rows a transaction: each instance sends 2 tables
