"""The SQL catalogue (docs/advanced/sql.md) against attacks and races found
in a review: each test is one way a query escaped its tenant or its limits,
or the mirror showed what an instance does not hold. The docstrings say
what went wrong before the fix."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import PG_ADMIN_URL
from yoke import App, Filter
from yoke.store.catalogue import Column, InstanceRows, TableRows
from yoke.store.catalogue_query import SqlRefused
from yoke.testing import env

app = App(name="sqlreview")


@app.actor("order", filter=Filter(types=["order.*"], key="payload.customer"))
async def order(ctx, event):
    """As in tests/http/test_sql.py: an order placed again replaces it."""
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER, status TEXT)")
    p = event.payload
    await ctx.sqlite.exec("INSERT OR REPLACE INTO orders (id, amount, status) VALUES (?, ?, ?)",
                          [p["id"], p["amount"], p["status"]])


@app.actor("totals", filter=Filter(types=["totals.*"], key="payload.k"))
async def totals(ctx, event):
    """Keeps one table; ``rebuild`` makes it again from scratch (same columns),
    ``swap`` renames it away and starts a new one (the old kept as an archive),
    ``drop`` drops it. Every run but ``drop`` also moves ctx.state (a noted
    row change, so the run's end is always collected)."""
    if event.type == "totals.drop":
        await ctx.sqlite.exec("DROP TABLE sums")
        return
    if event.type == "totals.rebuild":
        await ctx.sqlite.exec("DROP TABLE IF EXISTS sums")
        await ctx.sqlite.exec("CREATE TABLE sums (name TEXT, n INTEGER)")
        await ctx.sqlite.exec("INSERT INTO sums VALUES ('rebuilt', 2)")
    elif event.type == "totals.swap":
        await ctx.sqlite.exec("ALTER TABLE sums RENAME TO sums_archive")
        await ctx.sqlite.exec("CREATE TABLE sums (name TEXT, n INTEGER, note TEXT)")
    else:
        await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS sums (name TEXT, n INTEGER)")
        await ctx.sqlite.exec("INSERT INTO sums (name, n) VALUES (?, ?)", [event.payload["name"], 1])
    await ctx.state.update(lambda s: {"runs": (s or {}).get("runs", 0) + 1})


HALFWAY: asyncio.Event
GO_ON: asyncio.Event


@app.actor("pair", filter=Filter(types=["pair"], key="payload.k"))
async def pair(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS halves (side TEXT)")
    await ctx.sqlite.exec("INSERT INTO halves VALUES ('left')")
    if event.payload.get("wait"):
        HALFWAY.set()
        await GO_ON.wait()
    await ctx.sqlite.exec("INSERT INTO halves VALUES ('right')")


@pytest.fixture(params=["sqlite", "postgres"])
def postgres(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "postgres":
        monkeypatch.setenv("YOKE_TEST_PG_URL", PG_ADMIN_URL)
    return request.param == "postgres"


@pytest.fixture
def only_postgres(monkeypatch: pytest.MonkeyPatch) -> bool:
    monkeypatch.setenv("YOKE_TEST_PG_URL", PG_ADMIN_URL)
    return True


async def settle(e: Any) -> None:
    await e.idle()
    await e.y.sql_settled()


# --- 1. PostgreSQL: a quoted function name is not checked ---------------------------


async def test_pg_a_quoted_function_name_is_refused_like_any_other(only_postgres: bool) -> None:
    """The function check takes str(Anonymous.this), which keeps the quotes
    of "query_to_xml": nothing is refused, and the function runs any SQL
    text as the runtime role; "set_config" moves yoke.tenant first, so
    row-level security hands over another tenant's rows."""
    async with env(app, postgres=True) as e:
        await e.y.tokens.create("victim", ["read"], "victim-token-name")
        query = (
            "SELECT \"set_config\"('yoke.tenant', 'victim', true),"
            " \"query_to_xml\"('SELECT name, secret_hash FROM tokens', true, false, '')"
        )
        with pytest.raises(SqlRefused) as refused:
            leaked = await e.y.sql("attacker", query)
            assert "victim-token-name" not in str(leaked.rows)  # (it is there)
        assert refused.value.code == "sql_function_refused"


async def test_pg_a_quoted_set_config_is_refused_and_leaves_no_session_state(only_postgres: bool) -> None:
    """set_config(..., false) is session-wide: the pooled connection keeps
    default_transaction_read_only after the query, and Yoke's own writes
    on it then fail for any tenant (taken for a failover)."""
    async with env(app, postgres=True) as e:
        with contextlib.suppress(SqlRefused):
            await asyncio.gather(*(  # all at once: each on a pooled connection of its own
                e.y.sql("attacker", "SELECT \"set_config\"('default_transaction_read_only', 'on', false),"
                                    " \"pg_sleep\"(0.2)")
                for _ in range(10)
            ))
        # Another tenant's next writes: Unavailable, "the database is read-only
        # (a standby, or a primary being replaced)" (until the pool is replaced).
        await e.y.tokens.create("someone-else", ["read"], "n")
        await e.y.instances("someone-else").create("order", key="k")


# --- 2. SQLite: the time limit is checked every 10,000 VM steps -------------------


async def test_sqlite_the_time_limit_holds_and_other_reads_go_on() -> None:
    """Each row costs one expensive function call (~60 ms), and the progress
    handler looks at the clock only every 10,000 VM steps: timeout_s=1
    runs for many seconds (here ~10, it scales with the per-row cost), on
    one of the store's reader threads; two such queries hold both and
    every other read of the store waits."""
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 150)"
            " SELECT sum(length(hex(zeroblob(20000000 + i % 2)))) FROM n")
    async with env(app) as e:
        started = time.monotonic()
        queries = [asyncio.create_task(e.y.sql("attacker", slow, timeout_s=1)) for _ in range(2)]
        await asyncio.sleep(0.3)
        t = time.monotonic()
        await e.y.sql("someone-else", "SELECT 1")
        other_waited = time.monotonic() - t
        results = await asyncio.gather(*queries, return_exceptions=True)
        took = time.monotonic() - started
        assert took < 4 and other_waited < 2, (took, other_waited, results)


# --- 3. The check runs on the event loop, before any limit ------------------------


@pytest.mark.parametrize("postgres", ["sqlite"], indirect=True)
async def test_a_long_query_text_is_refused_before_it_stalls_the_event_loop(postgres: bool) -> None:
    """plan() (sqlglot's parse and scopes) is synchronous in async code and
    runs twice per query; its cost grows ~quadratically with the number of
    CTEs (16,000 CTEs, 0.5 MB: ~30 s per plan). The body limit is 64 MiB."""
    n = 6000
    query = "WITH " + ", ".join(
        f"c{i} AS (SELECT * FROM c{i - 1})" if i else "c0 AS (SELECT 1 AS x)" for i in range(n)
    ) + f" SELECT * FROM c{n - 1}"
    async with env(app) as e:
        lag = 0.0

        async def ticker() -> None:
            nonlocal lag
            while True:
                t = time.monotonic()
                await asyncio.sleep(0.01)
                lag = max(lag, time.monotonic() - t)

        tick = asyncio.create_task(ticker())
        await asyncio.sleep(0.05)
        with contextlib.suppress(SqlRefused):
            await e.y.sql("attacker", query)
        tick.cancel()
        assert lag < 0.5, f"the event loop stood still for {lag:.1f} s"


# --- 4. yoke.events' one-stream rule has holes -------------------------------------


async def test_yoke_events_is_not_unbounded_through_in_or_a_left_join(postgres: bool) -> None:
    async with env(app, postgres=postgres) as e:
        for path in ("/a", "/b", "/c"):
            await e.y.stream(path, "t").append({"type": "x"})
        for query in (
            "SELECT DISTINCT path FROM yoke.events WHERE path IN ('/nope', path)",
            "SELECT DISTINCT e.path FROM yoke.events e LEFT JOIN yoke.instances i ON path = '/nope'",
        ):
            with pytest.raises(SqlRefused) as refused:
                seen = await e.y.sql("t", query)
                assert len(seen.rows) <= 1, seen.rows  # (every stream's events)
            assert refused.value.code == "sql_events_unbounded"


# --- 5. Mirror: changes that fire no trigger ----------------------------------------


async def test_insert_or_replace_removes_the_replaced_row_from_the_mirror(postgres: bool) -> None:
    """REPLACE deletes the conflicting row without firing DELETE triggers
    (unless recursive_triggers is on): the old row id is never noted."""
    async with env(app, postgres=postgres) as e:
        for status in ("open", "paid"):
            await e.y.stream("/orders", "t").append(
                {"type": "order.placed", "payload": {"customer": "ann", "id": "a1", "amount": 5, "status": status}}
            )
            await settle(e)
        rows = await e.y.sql("t", 'SELECT id, status FROM "order".orders ORDER BY status')
        assert rows.rows == [["a1", "paid"]]  # (before the fix: [['a1', 'open'], ['a1', 'paid']])


async def test_a_schema_change_without_a_row_change_is_sent(postgres: bool) -> None:
    """_locked_run tells the mirror only when rows were noted (or the
    connection opened): a run that only drops a table (or adds a column,
    or makes a table) is never sent; the dropped table's rows stay."""
    async with env(app, postgres=postgres) as e:
        await e.y.stream("/t", "t").append({"type": "totals.add", "payload": {"k": "x", "name": "old"}})
        await settle(e)
        await e.y.stream("/t", "t").append({"type": "totals.drop", "payload": {"k": "x"}})
        await settle(e)
        with pytest.raises(SqlRefused) as refused:
            rows = await e.y.sql("t", "SELECT name FROM totals.sums")
            assert rows.rows == []  # (before the fix: [['old']]: the dropped table is still there)
        assert refused.value.code == "sql_unknown_table"


async def test_a_table_dropped_and_made_again_in_one_run_is_sent(postgres: bool) -> None:
    """The new table has no trigger until the next collect, and its columns
    equal the old ones, so collect sees nothing of it to send (the run's
    state change is sent)."""
    async with env(app, postgres=postgres) as e:
        await e.y.stream("/t", "t").append({"type": "totals.add", "payload": {"k": "x", "name": "old"}})
        await settle(e)
        await e.y.stream("/t", "t").append({"type": "totals.rebuild", "payload": {"k": "x"}})
        await settle(e)
        rows = await e.y.sql("t", "SELECT name, n FROM totals.sums")
        assert rows.rows == [["rebuilt", 2]]  # (before the fix: [['old', 1]])


async def test_a_table_made_under_a_renamed_tables_name_is_noted(postgres: bool) -> None:
    """ALTER TABLE sums RENAME TO sums_archive keeps the temp triggers
    "_yoke_capture:sums:*" (now on sums_archive); CREATE TEMP TRIGGER IF NOT
    EXISTS then skips the new sums: its writes are never noted, nor counted."""
    async with env(app, postgres=postgres) as e:
        await e.y.stream("/t", "t").append({"type": "totals.add", "payload": {"k": "x", "name": "before"}})
        await settle(e)
        await e.y.stream("/t", "t").append({"type": "totals.swap", "payload": {"k": "x"}})
        await settle(e)
        await e.y.stream("/t", "t").append({"type": "totals.add", "payload": {"k": "x", "name": "after"}})
        await settle(e)
        rows = await e.y.sql("t", "SELECT name FROM totals.sums")
        assert rows.rows == [["after"]]  # (before the fix: []: the new table's rows are never noted)


# --- 6. Mirror: a run seen in part ------------------------------------------------


async def test_a_run_that_starts_while_a_send_is_under_way_is_not_seen_in_part(postgres: bool) -> None:
    """flush() checks held() once, then awaits (mirrored(), other instances'
    reads, other tenants' sends) before it collects each instance: a run
    that began meanwhile is collected halfway."""
    global HALFWAY, GO_ON
    HALFWAY, GO_ON = asyncio.Event(), asyncio.Event()
    async with env(app, postgres=postgres) as e:
        y = e.y
        catalogue = y.store.catalogue
        real = catalogue.mirrored
        asked, gate = asyncio.Event(), asyncio.Event()

        async def slow_mirrored(tenant: str, ids: Any) -> dict[str, int]:
            asked.set()
            await gate.wait()
            return await real(tenant, ids)

        catalogue.mirrored = slow_mirrored
        try:
            await y.stream("/", "t").append({"type": "pair", "payload": {"k": "one"}})
            await asyncio.wait_for(asked.wait(), 10)  # the first run's send is under way
            await y.stream("/", "t").append({"type": "pair", "payload": {"k": "one", "wait": True}})
            await asyncio.wait_for(HALFWAY.wait(), 10)  # the second run is halfway
            gate.set()
            await y.sql_settled()
            during = await y.sql("t", "SELECT side, count(*) FROM pair.halves GROUP BY side ORDER BY side")
            assert during.rows == [["left", 1], ["right", 1]]  # (before the fix: [['left', 2], ['right', 1]])
        finally:
            gate.set()
            GO_ON.set()
            catalogue.mirrored = real


# --- 7. Mirror: an atomic run that did not commit (pg_sqlite) -----------------------


async def test_pg_sqlite_an_atomic_run_whose_store_commit_failed_does_not_show(only_postgres: bool) -> None:
    """The run commits its SQLite copy in memory, the store transaction fails
    (an append to a closed stream), reload() closes the connection and
    Capture.close() stashes the run's rows: they are sent, and stay until
    the instance's database is opened again."""
    atomic = App(name="atomic")

    @atomic.actor("ledger", filter=Filter(types=["go"]), effects="atomic", max_attempts=1)
    async def ledger(ctx, event):
        await ctx.state.update(lambda s: {"count": (s or {}).get("count", 0) + 1})
        await ctx.append({"type": "late"}, event.payload["to"])

    async with env(atomic, postgres=True, storage="pg_sqlite") as e:
        y = e.y
        await y.stream("/closed", "t").append({"type": "first"})
        await y.stream("/closed", "t").close()
        await y.instances("t").create("ledger", key="k")
        await y.stream("/", "t").append({"type": "go", "payload": {"to": "/open"}})
        await settle(e)
        await y.stream("/", "t").append({"type": "go", "payload": {"to": "/closed"}})  # fails, dead-lettered
        await settle(e)
        seen = await y.sql("t", "SELECT value FROM ledger.yoke_state")
        assert seen.rows == [['{"count":1}']]  # (before the fix: [['{"count":2}']])


# --- 8. Mirror store: a removal racing an instance's first send (PostgreSQL) -------


class _GatedConn:
    def __init__(self, conn: Any, looked: asyncio.Event, gate: asyncio.Event) -> None:
        self._conn, self._looked, self._gate = conn, looked, gate

    async def fetch(self, sql: str, *args: Any) -> Any:
        rows = await self._conn.fetch(sql, *args)
        if "FROM actor_instances" in sql:
            self._looked.set()
            await self._gate.wait()
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _GatedDb:
    def __init__(self, db: Any, looked: asyncio.Event, gate: asyncio.Event) -> None:
        self._db, self._looked, self._gate = db, looked, gate

    @contextlib.asynccontextmanager
    async def tx(self, tenant: str) -> AsyncIterator[Any]:
        async with self._db.tx(tenant) as conn:
            yield _GatedConn(conn, self._looked, self._gate)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_pg_a_removal_during_an_instances_first_send_leaves_nothing(only_postgres: bool) -> None:
    """A removal while an instance's first send is under way: the send holds
    the instance's row (FOR KEY SHARE), so the removal waits for it and then
    removes what it wrote. (Without the lock the removal committed first,
    found no sql_instances row, and the send's rows stayed for good.)"""
    async with env(app, postgres=True) as e:
        y = e.y
        info = await y.instances("t").create("order", key="gone")
        looked, gate = asyncio.Event(), asyncio.Event()
        catalogue = y.store.catalogue
        real_db = catalogue._db
        catalogue._db = _GatedDb(real_db, looked, gate)
        try:
            change = InstanceRows(
                info.instance_id, (1 << 32) | 1,
                {"orders": TableRows(("id", "amount", "status"), {1: ("o1", 5, "open")}, whole=True)},
                shapes={"orders": (Column("id", "TEXT"), Column("amount", "INTEGER"), Column("status", "TEXT"))},
                whole=True,
            )
            sending = asyncio.create_task(catalogue.mirror("t", [change]))
            await asyncio.wait_for(looked.wait(), 10)
            catalogue._db = real_db
            removing = asyncio.create_task(y.instances("t").remove(info.instance_id))
            done, _ = await asyncio.wait([removing], timeout=0.5)
            assert not done  # it waits for the send's transaction
            gate.set()
            await asyncio.wait_for(asyncio.gather(sending, removing), 10)
        finally:
            gate.set()
            catalogue._db = real_db
        # Nothing of it is left: no row, no table of it in the catalogue.
        assert await catalogue.mirrored("t", [info.instance_id]) == {}
        assert not [t for t in await y.sql_tables("t") if t.schema == "order"]


# --- 9. Mirror store: an older whole write replaces a newer one --------------------


async def test_an_older_whole_write_does_not_replace_a_newer_one(postgres: bool) -> None:
    """catalogue.mirror applies a whole write whenever its version differs.
    A process that lost an instance (forget) still sends the whole write it
    stashed after a failed send (collect(None) returns the stash): it lands
    over the new owner's newer one, which then sends only deltas."""
    async with env(app, postgres=postgres) as e:
        y = e.y
        info = await y.instances("t").create("order", key="k")
        shapes = {"orders": (Column("id", "TEXT"), Column("amount", "INTEGER"), Column("status", "TEXT"))}

        def whole(version: int, status: str) -> InstanceRows:
            return InstanceRows(
                info.instance_id, version << 32,
                {"orders": TableRows(("id", "amount", "status"), {1: ("o1", 5, status)}, whole=True)},
                shapes=shapes, whole=True,
            )

        await y.store.catalogue.mirror("t", [whole(5, "newer")])
        await y.store.catalogue.mirror("t", [whole(3, "older")])
        rows = await y.sql("t", 'SELECT status FROM "order".orders')
        assert rows.rows == [["newer"]]  # (before the fix: [['older']])

