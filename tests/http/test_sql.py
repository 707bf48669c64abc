"""The SQL catalogue over HTTP (``POST /v1/sql``, ``GET /v1/sql/tables``):
one read-only query across every actor instance's tables and Yoke's
records, on both backends.

The app runs in this process (``yoke.testing.env``: the real runtime on a
database of its own) and the API is served from it through an ASGI
transport, with real tokens: each tenant's token sees its own tenant only.
Runs are waited for with ``env.idle()`` and the mirror with
``y.sql_settled()``, so every answer below is exact, with no sleeps.
"""

from __future__ import annotations

import contextlib
import csv
import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import PG_ADMIN_URL
from yoke import App, Filter
from yoke.http.app import asgi_app, create_app, serve_runtime
from yoke.testing import Environment, env

app = App(name="sqlshop")


@app.actor("order", filter=Filter(types=["order.*"], key="payload.customer"))
async def order(ctx, event):
    """One instance per customer: its orders in a table of its own, and a
    count in its state."""
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER, status TEXT)")
    p = event.payload
    await ctx.sqlite.exec("INSERT OR REPLACE INTO orders (id, amount, status) VALUES (?, ?, ?)",
                          [p["id"], p["amount"], p["status"]])
    await ctx.state.update(lambda s: {"orders": s.get("orders", 0) + 1})


@app.actor("note", filter=Filter(types=["note.*"], key="payload.topic"))
async def note(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS notes (body TEXT, stars REAL)")
    await ctx.sqlite.exec("INSERT INTO notes VALUES (?, ?)", [event.payload["body"], event.payload["stars"]])


# --- the orders each test places, and what it expects of them --------------------------


@dataclass(frozen=True)
class Order:
    customer: str
    id: str
    amount: int
    status: str

    def event(self) -> dict[str, Any]:
        return {"type": "order.placed",
                "payload": {"customer": self.customer, "id": self.id, "amount": self.amount, "status": self.status}}


def orders_of(customers: dict[str, int], *, base: int = 0) -> list[Order]:
    """``customers``: how many orders each places; amounts and statuses
    vary by customer and order so that no two sums agree by accident."""
    placed = []
    for c, (customer, count) in enumerate(sorted(customers.items())):
        for i in range(count):
            amount = base + 7 * (c + 1) + 13 * i * (i + 1)
            placed.append(Order(customer, f"{customer}-{i}", amount, ("paid", "open", "void")[(c + i) % 3]))
    return placed


def per_customer(orders: list[Order]) -> dict[str, tuple[int, int]]:
    """customer -> (how many orders, their total)."""
    out: dict[str, tuple[int, int]] = {}
    for o in orders:
        n, total = out.get(o.customer, (0, 0))
        out[o.customer] = (n + 1, total + o.amount)
    return out


# --- the app, its API, tokens ---------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgres"])
def postgres(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    if request.param == "postgres":
        monkeypatch.setenv("YOKE_TEST_PG_URL", PG_ADMIN_URL)
    return request.param == "postgres"


class Site:
    """The runtime (``env.y``) with the HTTP API in front of it."""

    def __init__(self, e: Environment, postgres: bool) -> None:
        self.env = e
        self.y = e.y
        self.postgres = postgres
        self.backend = "postgres" if postgres else "sqlite"
        self.web = create_app(contextlib.nullcontext)  # no lifespan: the runtime is set below
        serve_runtime(self.web, e.y)
        self._clients: list[httpx.AsyncClient] = []

    async def client(self, tenant: str, scopes: list[str] | None = None) -> httpx.AsyncClient:
        """A client with a new token of ``tenant`` (``scopes``: default read);
        ``scopes=[]``: no token at all."""
        headers = {}
        if scopes != []:
            made = await self.y.tokens.create(tenant, scopes or ["read"], "sql test")
            headers["Authorization"] = f"Bearer {made.token}"
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=asgi_app(self.web)), base_url="http://yoke.test", headers=headers
        )
        self._clients.append(client)
        return client

    async def place(self, tenant: str, *events: dict[str, Any], path: str = "/orders") -> None:
        """Append the events; returns once every run they cause finished and
        its rows are in the catalogue."""
        await self.y.stream(path, tenant).append_many(list(events))
        await self.settled()

    async def settled(self) -> None:
        await self.env.idle()
        await self.y.sql_settled()

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()


@pytest.fixture
async def site(postgres: bool) -> AsyncIterator[Site]:
    async with env(app, postgres=postgres) as e:
        s = Site(e, postgres)
        try:
            yield s
        finally:
            await s.close()


async def sql(client: httpx.AsyncClient, query: str, params: list[Any] | None = None, **options: Any) -> dict[str, Any]:
    """The answer of a query that must succeed."""
    body: dict[str, Any] = {"query": query, **options}
    if params is not None:
        body["params"] = params
    answer = await client.post("/v1/sql", json=body)
    assert answer.status_code == 200, (query, answer.text)
    result = answer.json()
    assert set(result) == {"columns", "rows", "truncated"}
    return result


async def refused(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    """The error of a request that must be refused with 400."""
    answer = await client.post("/v1/sql", json=body)
    assert answer.status_code == 400, (body, answer.text)
    error = answer.json()["error"]
    assert set(error) >= {"code", "message", "field"} and error["message"], error
    return error


def as_dicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [dict(zip(result["columns"], row, strict=True)) for row in result["rows"]]


YOKE_TABLES = ["instances", "streams", "queue", "schedules", "subscriptions", "failures", "events"]
ALL_ORDERS = 'SELECT instance_id, key, id, amount, status FROM "order".orders ORDER BY id'


# --- queries across instances ---------------------------------------------------------


async def test_an_aggregate_across_instances_matches_each_instance(site: Site) -> None:
    """A keyed actor wrote rows for several keys: one GROUP BY over all its
    instances gives, per instance, the count and sum the test placed, and
    each instance's own database says the same."""
    placed = orders_of({"ann": 3, "bob": 5, "cy": 1, "dee": 4})
    await site.place("acme", *(o.event() for o in placed))
    expected = per_customer(placed)
    http = await site.client("acme")

    result = await sql(http, 'SELECT key, instance_id, count(*) AS n, sum(amount) AS total'
                             ' FROM "order".orders GROUP BY key, instance_id ORDER BY key')
    assert result["columns"] == ["key", "instance_id", "n", "total"] and result["truncated"] is False
    assert {r["key"]: (r["n"], r["total"]) for r in as_dicts(result)} == expected
    assert [r["key"] for r in as_dicts(result)] == sorted(expected)

    # Each row's instance is that customer's instance, and its own tables agree.
    instances = site.y.instances("acme")
    for row in as_dicts(result):
        found = await instances.find("order", row["key"])
        assert found is not None and found.instance_id == row["instance_id"]
        own = await instances.query(found.instance_id, "SELECT count(*), sum(amount) FROM orders", (), max_rows=10)
        assert tuple(own.rows[0]) == (row["n"], row["total"])

    # Grouped by two columns, with HAVING.
    by_status = await sql(http, 'SELECT key, status, count(*) AS n, sum(amount) AS total FROM "order".orders'
                                ' GROUP BY key, status HAVING count(*) >= 1 ORDER BY key, status')
    want: dict[tuple[str, str], list[int]] = {}
    for o in placed:
        n_total = want.setdefault((o.customer, o.status), [0, 0])
        n_total[0] += 1
        n_total[1] += o.amount
    assert [(r["key"], r["status"], r["n"], r["total"]) for r in as_dicts(by_status)] == [
        (k, s, n, t) for (k, s), (n, t) in sorted(want.items())
    ]

    # The whole table, columns in order: instance_id, key, then the table's own.
    everything = await sql(http, 'SELECT * FROM "order".orders ORDER BY id')
    assert everything["columns"] == ["instance_id", "key", "id", "amount", "status"]
    assert [(r[1], r[2], r[3], r[4]) for r in everything["rows"]] == sorted(
        ((o.customer, o.id, o.amount, o.status) for o in placed), key=lambda t: t[1]
    )

    # ctx.state as "order".yoke_state: its value as JSON text.
    states = as_dicts(await sql(http, 'SELECT key, value, version FROM "order".yoke_state ORDER BY key'))
    assert {s["key"]: orjson.loads(s["value"]) for s in states} == {
        k: {"orders": n} for k, (n, _) in expected.items()
    }
    assert all(isinstance(s["version"], int) and s["version"] >= 1 for s in states)


async def test_a_join_with_yoke_instances_a_window_and_a_cte(site: Site) -> None:
    placed = orders_of({"ann": 4, "bob": 2, "cy": 3})
    await site.place("acme", *(o.event() for o in placed))
    await site.place("acme", {"type": "note.added", "payload": {"topic": "misc", "body": "hello", "stars": 4.5}},
                     path="/notes")
    expected = per_customer(placed)
    http = await site.client("acme")

    # JOIN ... USING (instance_id): each order with its instance's record.
    joined = as_dicts(await sql(
        http,
        'SELECT i.actor, i.key AS instance_key, o.key, count(*) AS n, sum(o.amount) AS total'
        ' FROM "order".orders o JOIN yoke.instances i USING (instance_id)'
        ' GROUP BY i.actor, i.key, o.key ORDER BY i.key',
    ))
    assert [(r["actor"], r["instance_key"], r["n"], r["total"]) for r in joined] == [
        ("order", k, n, t) for k, (n, t) in sorted(expected.items())
    ]
    assert all(r["instance_key"] == r["key"] for r in joined)
    # yoke.instances holds the note instance too; the join keeps only the orders'.
    instances = as_dicts(await sql(http, "SELECT actor, key FROM yoke.instances ORDER BY actor, key"))
    assert instances == [{"actor": "note", "key": "misc"}] + [{"actor": "order", "key": k} for k in sorted(expected)]
    # A LEFT JOIN from yoke.instances: the note instance has no orders.
    left = as_dicts(await sql(
        http,
        'SELECT i.actor, i.key, count(o.id) AS n FROM yoke.instances i'
        ' LEFT JOIN "order".orders o ON o.instance_id = i.instance_id GROUP BY i.actor, i.key ORDER BY i.actor, i.key',
    ))
    assert left == [{"actor": "note", "key": "misc", "n": 0}] + [
        {"actor": "order", "key": k, "n": n} for k, (n, _) in sorted(expected.items())
    ]

    # Window functions: each customer's largest order, and running totals.
    ranked = as_dicts(await sql(
        http,
        'SELECT key, id, amount,'
        ' row_number() OVER (PARTITION BY key ORDER BY amount DESC, id) AS place,'
        ' sum(amount) OVER (PARTITION BY key) AS total,'
        ' sum(amount) OVER (PARTITION BY key ORDER BY id ROWS UNBOUNDED PRECEDING) AS running'
        ' FROM "order".orders ORDER BY key, id',
    ))
    assert len(ranked) == len(placed)
    for customer, (n, total) in expected.items():
        mine = sorted((o for o in placed if o.customer == customer), key=lambda o: o.id)
        rows = [r for r in ranked if r["key"] == customer]
        assert [r["id"] for r in rows] == [o.id for o in mine]
        assert all(r["total"] == total for r in rows)
        running = 0
        for r, o in zip(rows, mine, strict=True):
            running += o.amount
            assert r["running"] == running
        top = max(mine, key=lambda o: o.amount)  # (amounts grow with each order: no ties)
        assert [r["id"] for r in rows if r["place"] == 1] == [top.id]
        assert sorted(r["place"] for r in rows) == list(range(1, n + 1))

    # A CTE (two, the second reading the first) with a scalar subquery.
    above = await sql(
        http,
        'WITH per AS (SELECT key, sum(amount) AS total FROM "order".orders GROUP BY key),'
        ' average AS (SELECT avg(total) AS mean FROM per)'
        ' SELECT key, total FROM per WHERE total > (SELECT mean FROM average) ORDER BY key',
    )
    mean = sum(t for _, t in expected.values()) / len(expected)
    assert [tuple(r) for r in above["rows"]] == [(k, t) for k, (_, t) in sorted(expected.items()) if t > mean]
    # A recursive CTE over an actor table.
    counted = await sql(
        http,
        'WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL'
        ' SELECT i + 1 FROM n WHERE i < (SELECT count(*) FROM "order".orders))'
        ' SELECT count(*) AS c, max(i) AS top FROM n',
    )
    assert counted["rows"] == [[len(placed), len(placed)]]

    # Another actor's table, REAL values as numbers.
    assert (await sql(http, 'SELECT key, body, stars FROM note.notes'))["rows"] == [["misc", "hello", 4.5]]


async def test_params_csv_and_max_rows(site: Site) -> None:
    placed = orders_of({"ann": 3, "bob": 6, "cy": 2})
    await site.place("acme", *(o.event() for o in placed))
    http = await site.client("acme")

    # ? marks take params, in order; strings, numbers and null.
    bobs = [o for o in placed if o.customer == "bob"]
    floor = sorted(o.amount for o in bobs)[2]
    found = await sql(http, 'SELECT id, amount FROM "order".orders WHERE key = ? AND amount >= ? ORDER BY id',
                      ["bob", floor])
    assert [tuple(r) for r in found["rows"]] == sorted((o.id, o.amount) for o in bobs if o.amount >= floor)
    # (PostgreSQL types a bare ? in the select list as text: the casts say what each is.)
    typed = await sql(http, "SELECT ? AS a, CAST(? AS REAL) AS b, coalesce(?, 'none') AS c, CAST(? AS INTEGER) AS d",
                      ["x", 2.5, None, 7])
    assert typed["rows"] == [["x", 2.5, "none", 7]]
    # A param is a value, never SQL.
    sneaky = '\'; DELETE FROM "order".orders; --'
    assert (await sql(http, 'SELECT count(*) AS n FROM "order".orders WHERE id = ?', [sneaky]))["rows"] == [[0]]

    # CSV: a header of the column names, then the rows (NULL as empty).
    answer = await http.post("/v1/sql", json={
        "query": 'SELECT key, id, amount, NULL AS missing FROM "order".orders ORDER BY id'
    }, headers={"Accept": "text/csv"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/csv")
    assert "x-yoke-truncated" not in answer.headers
    lines = list(csv.reader(io.StringIO(answer.text)))
    assert lines[0] == ["key", "id", "amount", "missing"]
    assert lines[1:] == [[o.customer, o.id, str(o.amount), ""] for o in sorted(placed, key=lambda o: o.id)]
    # A value with a comma, a quote and a newline survives the round trip.
    odd = 'a,b "c"\nd'
    answer = await http.post("/v1/sql", json={"query": "SELECT ? AS odd, 1 AS one", "params": [odd]},
                             headers={"Accept": "text/csv"})
    assert list(csv.reader(io.StringIO(answer.text))) == [["odd", "one"], [odd, "1"]]

    # max_rows cuts the rows and says so; exactly as many is not cut.
    total = len(placed)
    cut = await sql(http, ALL_ORDERS, max_rows=4)
    assert len(cut["rows"]) == 4 and cut["truncated"] is True
    assert [r[2] for r in cut["rows"]] == sorted(o.id for o in placed)[:4]
    whole = await sql(http, ALL_ORDERS, max_rows=total)
    assert len(whole["rows"]) == total and whole["truncated"] is False
    over = await sql(http, ALL_ORDERS, max_rows=total - 1)
    assert len(over["rows"]) == total - 1 and over["truncated"] is True
    one = await sql(http, ALL_ORDERS, max_rows=1)
    assert len(one["rows"]) == 1 and one["truncated"] is True
    # In CSV, a header says the rows were cut.
    answer = await http.post("/v1/sql", json={"query": ALL_ORDERS, "max_rows": 2}, headers={"Accept": "text/csv"})
    assert answer.headers.get("x-yoke-truncated") == "true"
    assert len(list(csv.reader(io.StringIO(answer.text)))) == 3

    # Bad max_rows, timeout_s, params and unknown fields: invalid_input, naming the field.
    for body, field in [
        ({"max_rows": 0}, "max_rows"), ({"max_rows": 100_001}, "max_rows"), ({"max_rows": "10"}, "max_rows"),
        ({"max_rows": True}, "max_rows"), ({"max_rows": 2.5}, "max_rows"),
        ({"timeout_s": 0}, "timeout_s"), ({"timeout_s": -1}, "timeout_s"), ({"timeout_s": 301}, "timeout_s"),
        ({"timeout_s": "1"}, "timeout_s"),
        ({"params": {"a": 1}}, "params"), ({"params": "x"}, "params"), ({"params": [[1]]}, "params"),
        ({"params": [{"a": 1}]}, "params"),
    ]:
        error = await refused(http, {"query": "SELECT 1", **body})
        assert (error["code"], error["field"]) == ("invalid_input", field), (body, error)
    error = await refused(http, {"query": "SELECT 1", "bogus": 1})
    assert error["code"] == "invalid_input" and "bogus" in error["message"]
    for query in (None, "", "   ", 7):
        error = await refused(http, {"query": query})
        assert (error["code"], error["field"]) == ("invalid_input", "query"), (query, error)


# --- what a query may not do -----------------------------------------------------------

COMMON_REFUSALS = [
    ('SELECT 1; SELECT 2', "sql_one_statement"),
    ('SELECT * FROM "order".orders; DELETE FROM "order".orders', "sql_one_statement"),
    ("INSERT INTO \"order\".orders (id, amount, status) VALUES ('x', 1, 'paid')", "sql_read_only"),
    ('DELETE FROM "order".orders', "sql_read_only"),
    ('UPDATE "order".orders SET amount = 0', "sql_read_only"),
    ("CREATE TABLE \"order\".evil (a INTEGER)", "sql_read_only"),
    ("CREATE TABLE evil AS SELECT * FROM \"order\".orders", "sql_read_only"),
    ('DROP TABLE "order".orders', "sql_read_only"),
    ('WITH gone AS (DELETE FROM "order".orders RETURNING *) SELECT * FROM gone', "sql_read_only"),
    ("PRAGMA table_info(orders)", "sql_read_only"),
    ('SELECT * FROM "order".orders FOR UPDATE', "sql_read_only"),
    ("SELECT load_extension('/tmp/evil.so')", "sql_function_refused"),
    ("SELECT readfile('/etc/passwd')", "sql_function_refused"),
    ("SELECT pg_read_file('/etc/passwd')", "sql_function_refused"),
    ("SELECT set_config('statement_timeout', '0', false)", "sql_function_refused"),
    ("SELECT pg_sleep(30)", "sql_function_refused"),
    ('SELECT * FROM "order".nothing_like_it', "sql_unknown_table"),
    ("SELECT * FROM nobody.orders", "sql_unknown_table"),
    ("SELECT * FROM yoke.tokens", "sql_unknown_table"),
    ("SELECT * FROM orders", "sql_unknown_table"),
    ("SELECT * FROM actor_instances", "sql_unknown_table"),
    ("SELECT * FROM tokens", "sql_unknown_table"),
    ("SELECT * FROM yoke.events", "sql_events_unbounded"),
    ("SELECT count(*) FROM yoke.events WHERE type = 'order.placed'", "sql_events_unbounded"),
    ("SELECT 'unterminated", "sql_syntax"),
]
# SQLite's own statements: PostgreSQL's parser may not know them (then sql_syntax).
SQLITE_ONLY = [
    "ATTACH DATABASE '/tmp/other.db' AS other",
    "ATTACH '/tmp/other.db' AS other",
    "DETACH DATABASE main",
    "PRAGMA writable_schema = ON",
    "VACUUM",
]
SQLITE_ONLY_CODES = {"sqlite": {"sql_read_only"}, "postgres": {"sql_read_only", "sql_syntax"}}


async def test_refusals_each_with_its_code_and_nothing_changes(site: Site) -> None:
    placed = orders_of({"ann": 2, "bob": 3})
    await site.place("acme", *(o.event() for o in placed))
    http = await site.client("acme", ["admin"])  # even an admin token reads only
    before = await sql(http, ALL_ORDERS)
    assert len(before["rows"]) == len(placed)
    instances = site.y.instances("acme")
    own_before = {
        key: (await instances.query((await instances.find("order", key)).instance_id,
                                    "SELECT * FROM orders ORDER BY id", (), max_rows=100)).rows
        for key in ("ann", "bob")
    }

    for query, code in COMMON_REFUSALS:
        error = await refused(http, {"query": query})
        assert (error["code"], error["field"]) == (code, "query"), (site.backend, query, error)
    for query in SQLITE_ONLY:
        error = await refused(http, {"query": query})
        assert error["code"] in SQLITE_ONLY_CODES[site.backend], (site.backend, query, error)

    # The mirror and each instance's own database are as they were.
    await site.settled()
    assert await sql(http, ALL_ORDERS) == before
    for key, rows in own_before.items():
        iid = (await instances.find("order", key)).instance_id
        assert (await instances.query(iid, "SELECT * FROM orders ORDER BY id", (), max_rows=100)).rows == rows
    # And yoke.events with a path is allowed (the two order streams' events, in order).
    events = await sql(http, "SELECT path, \"offset\", type FROM yoke.events WHERE path = ? ORDER BY \"offset\"",
                       ["/orders"])
    assert events["rows"] == [["/orders", i, "order.placed"] for i in range(1, len(placed) + 1)]
    events = await sql(http, "SELECT count(*) FROM yoke.events e WHERE e.path IN ('/orders', '/none')")
    assert events["rows"] == [[len(placed)]]


async def test_a_query_that_runs_long_stops_at_its_time_limit(site: Site) -> None:
    await site.place("acme", *(o.event() for o in orders_of({"ann": 1})))
    http = await site.client("acme")
    forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    bounded = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 1000000000000)"
               ' SELECT count(*) FROM n, "order".orders')
    for query in (forever, bounded):
        started = time.monotonic()
        error = await refused(http, {"query": query, "timeout_s": 0.3})
        took = time.monotonic() - started
        assert (error["code"], error["field"]) == ("sql_timeout", "query"), error
        assert 0.25 <= took < 5, took
    # The API answers on at once, and a quick query under the same limit runs.
    assert (await sql(http, 'SELECT count(*) FROM "order".orders', timeout_s=0.3))["rows"] == [[1]]
    # The Python API refuses the same way.
    from yoke.store.catalogue_query import SqlRefused

    with pytest.raises(SqlRefused) as caught:
        await site.y.sql("acme", forever, timeout_s=0.2)
    assert caught.value.code == "sql_timeout"


async def test_the_settings_are_the_limits_a_call_does_not_set(postgres: bool) -> None:
    """sql_max_rows and sql_timeout_s apply when a call gives no max_rows or
    timeout_s (and a call may ask for more than the settings)."""
    async with env(app, postgres=postgres, sql_max_rows=3, sql_timeout_s=0.3) as e:
        s = Site(e, postgres)
        try:
            placed = orders_of({"ann": 2, "bob": 3})
            await s.place("acme", *(o.event() for o in placed))
            http = await s.client("acme")
            cut = await sql(http, ALL_ORDERS)
            assert len(cut["rows"]) == 3 and cut["truncated"] is True
            whole = await sql(http, ALL_ORDERS, max_rows=100)
            assert len(whole["rows"]) == len(placed) and whole["truncated"] is False
            forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
            started = time.monotonic()
            assert (await refused(http, {"query": forever}))["code"] == "sql_timeout"
            assert time.monotonic() - started < 5
        finally:
            await s.close()


# --- tenants, tokens, scopes ---------------------------------------------------------


async def test_each_tenant_sees_only_its_own(site: Site) -> None:
    """Two tenants run the same actor with the same keys: each token's
    queries see that tenant's rows, instances, state and tables only."""
    acme_orders = orders_of({"ann": 2, "bob": 3})
    globex_orders = orders_of({"ann": 4, "cy": 1}, base=1000)
    await site.y.stream("/orders", "acme").append_many([o.event() for o in acme_orders])
    await site.y.stream("/orders", "globex").append_many([o.event() for o in globex_orders])
    await site.place("acme", {"type": "note.added", "payload": {"topic": "t", "body": "acme's", "stars": 1}},
                     path="/notes")
    acme, globex = await site.client("acme"), await site.client("globex")

    grouped = 'SELECT key, count(*) AS n, sum(amount) AS total FROM "order".orders GROUP BY key ORDER BY key'
    for http, placed in ((acme, acme_orders), (globex, globex_orders)):
        assert {r["key"]: (r["n"], r["total"]) for r in as_dicts(await sql(http, grouped))} == per_customer(placed)
        assert (await sql(http, 'SELECT id FROM "order".orders ORDER BY id'))["rows"] == sorted(
            [o.id] for o in placed
        )
    # yoke.instances: each tenant's own, whose ids are those its rows carry.
    for http, tenant, keys in ((acme, "acme", ["ann", "bob"]), (globex, "globex", ["ann", "cy"])):
        listed = as_dicts(await sql(
            http, "SELECT instance_id, actor, key FROM yoke.instances WHERE actor = 'order' ORDER BY key"
        ))
        assert [r["key"] for r in listed] == keys
        for r in listed:
            found = await site.y.instances(tenant).find("order", r["key"])
            assert found is not None and found.instance_id == r["instance_id"]
        joined = await sql(http, 'SELECT count(*) FROM "order".orders JOIN yoke.instances USING (instance_id)')
        assert joined["rows"] == [[len(acme_orders if tenant == "acme" else globex_orders)]]
    ann_acme = (await site.y.instances("acme").find("order", "ann")).instance_id
    ann_globex = (await site.y.instances("globex").find("order", "ann")).instance_id
    assert ann_acme != ann_globex
    # Another tenant's instance id finds nothing, even when named.
    assert (await sql(globex, 'SELECT * FROM "order".orders WHERE instance_id = ?', [ann_acme]))["rows"] == []
    assert (await sql(globex, "SELECT * FROM yoke.instances WHERE instance_id = ?", [ann_acme]))["rows"] == []
    # State, streams and events: each its own.
    for http, placed in ((acme, acme_orders), (globex, globex_orders)):
        states = as_dicts(await sql(http, 'SELECT key, value FROM "order".yoke_state ORDER BY key'))
        assert {s["key"]: orjson.loads(s["value"]) for s in states} == {
            k: {"orders": n} for k, (n, _) in per_customer(placed).items()
        }
        heads = as_dicts(await sql(http, "SELECT path, head FROM yoke.streams WHERE path = '/orders'"))
        assert heads == [{"path": "/orders", "head": len(placed)}]
        assert (await sql(http, "SELECT count(*) FROM yoke.events WHERE path = '/orders'"))["rows"] == [[len(placed)]]
    # The note actor ran in acme only: globex cannot name its table, nor list it.
    assert (await sql(acme, "SELECT body FROM note.notes"))["rows"] == [["acme's"]]
    assert (await refused(globex, {"query": "SELECT body FROM note.notes"}))["code"] == "sql_unknown_table"
    named = {(t["schema"], t["name"]) for t in (await globex.get("/v1/sql/tables")).json()["tables"]}
    assert ("order", "orders") in named and ("note", "notes") not in named
    # A token cannot act in another tenant.
    answer = await globex.post("/v1/sql", params={"tenant": "acme"}, json={"query": "SELECT 1"})
    assert answer.status_code == 403, answer.text
    # The Python API takes the tenant as given.
    assert (await site.y.sql("globex", 'SELECT count(*) FROM "order".orders')).rows == [[len(globex_orders)]]


async def test_reading_needs_the_read_scope(site: Site) -> None:
    await site.place("acme", *(o.event() for o in orders_of({"ann": 1})))
    query = {"query": 'SELECT count(*) FROM "order".orders'}
    for scopes, status in ((["append"], 403), ([], 401), (["read"], 200), (["admin"], 200), (["read", "append"], 200)):
        http = await site.client("acme", scopes)
        answer = await http.post("/v1/sql", json=query)
        assert answer.status_code == status, (scopes, answer.text)
        tables = await http.get("/v1/sql/tables")
        assert tables.status_code == status, (scopes, tables.text)
        if status == 200:
            assert answer.json()["rows"] == [[1]]
        else:
            code = answer.json()["error"]["code"]
            assert code == ("forbidden" if status == 403 else "unauthorized"), answer.text


async def test_the_tables_a_query_can_name(site: Site) -> None:
    http = await site.client("acme")
    before = (await http.get("/v1/sql/tables")).json()["tables"]
    # No actor ran yet: Yoke's records only.
    assert [(t["schema"], t["name"], t["columns"]) for t in before] == [("yoke", name, []) for name in YOKE_TABLES]
    await site.place("acme", *(o.event() for o in orders_of({"ann": 1, "bob": 1})))
    await site.place("acme", {"type": "note.added", "payload": {"topic": "x", "body": "b", "stars": 2}}, path="/n")
    answer = await http.get("/v1/sql/tables")
    assert answer.status_code == 200
    tables = {(t["schema"], t["name"]): t["columns"] for t in answer.json()["tables"]}
    assert tables[("order", "orders")] == [
        {"name": "instance_id", "declared": "TEXT"}, {"name": "key", "declared": "TEXT"},
        {"name": "id", "declared": "TEXT"}, {"name": "amount", "declared": "INTEGER"},
        {"name": "status", "declared": "TEXT"},
    ]
    assert [c["name"] for c in tables[("order", "yoke_state")]] == ["instance_id", "key", "value", "version"]
    assert tables[("note", "notes")] == [
        {"name": "instance_id", "declared": "TEXT"}, {"name": "key", "declared": "TEXT"},
        {"name": "body", "declared": "TEXT"}, {"name": "stars", "declared": "REAL"},
    ]
    assert [name for schema, name in tables if schema == "yoke"] == YOKE_TABLES
    # Every table listed can be named, and answers with the columns listed.
    for (schema, name), columns in tables.items():
        if schema == "yoke":
            query = f'SELECT * FROM yoke.{name}' + (" WHERE path = '/orders'" if name == "events" else "")
            await sql(http, query)
            continue
        result = await sql(http, f'SELECT * FROM "{schema}"."{name}"')
        assert result["columns"] == [c["name"] for c in columns]
        # (note never sets its state: its yoke_state is listed, with no rows)
        assert len(result["rows"]) == {("order", "orders"): 2, ("order", "yoke_state"): 2, ("note", "notes"): 1,
                                       ("note", "yoke_state"): 0}[(schema, name)]


# --- found while writing these tests: each fails today ------------------------------


async def test_a_cte_name_does_not_open_the_database_table_of_that_name(site: Site) -> None:
    """A name is exempt from "name tables as ACTOR.TABLE or yoke.TABLE"
    when a CTE of that name is declared anywhere in the query
    (``catalogue_query.plan`` collects CTE names over the whole tree), but
    the database resolves the name to its own table wherever that CTE is
    not in scope: in a CTE's own body (PostgreSQL: a non-recursive CTE does
    not see itself) or in another subquery. PostgreSQL then reads any table
    the runtime role can (``tokens`` with their secret hashes, the
    ``yoke_tenants`` list of every tenant, which has no row-level security,
    ``pg_database``); SQLite counts the rows of the tables under a named
    view across every tenant. Each should be refused as sql_unknown_table."""
    await site.place("acme", *(o.event() for o in orders_of({"ann": 2})))
    await site.place("globex", *(o.event() for o in orders_of({"bob": 3, "cy": 1})))
    http = await site.client("acme")
    queries = [
        "WITH yoke_tenants AS (SELECT * FROM yoke_tenants) SELECT * FROM yoke_tenants",
        "WITH tokens AS (SELECT token_id, secret_hash FROM tokens) SELECT * FROM tokens",
        "SELECT * FROM (SELECT tenant_id FROM yoke_tenants) a, (WITH yoke_tenants AS (SELECT 1) SELECT 1) b",
        "WITH pg_database AS (SELECT datname FROM pg_database) SELECT * FROM pg_database",
        "SELECT (SELECT count(*) FROM actor_instances) AS everyone,"
        " (WITH actor_instances AS (SELECT 1) SELECT 1) AS x, (SELECT count(*) FROM yoke.instances) AS mine",
    ]
    not_refused = []
    for query in queries:
        answer = await http.post("/v1/sql", json={"query": query})
        if answer.status_code == 200 or answer.json()["error"]["code"] != "sql_unknown_table":
            not_refused.append((query, answer.status_code, answer.text[:300]))
    assert not_refused == [], not_refused


async def test_yoke_events_needs_its_path_compared_with_a_value(site: Site) -> None:
    """``yoke.events`` is read one stream at a time: the query must compare
    ``path`` with a value. ``path = path`` is refused, but a comparison
    OR'ed with anything still counts (``_check_events_bounded`` looks for
    an = or IN anywhere in the WHERE, not for one the WHERE depends on),
    and the query reads every stream."""
    await site.place("acme", *(o.event() for o in orders_of({"ann": 2})))
    http = await site.client("acme")
    passed = []
    for query in (
        "SELECT count(*) FROM yoke.events WHERE path = path",
        "SELECT count(*) FROM yoke.events WHERE path = '/none' OR 1 = 1",
    ):
        answer = await http.post("/v1/sql", json={"query": query})
        if answer.status_code != 400 or answer.json()["error"]["code"] != "sql_events_unbounded":
            passed.append((query, answer.status_code, answer.text[:200]))
    assert passed == [], passed


async def test_every_refused_function_is_refused(site: Site) -> None:
    """``version`` is on the list of refused functions, but on PostgreSQL
    sqlglot parses ``version()`` as a function of its own type (not
    ``exp.Anonymous``), which ``_function_name`` takes for a standard one:
    the query runs and answers the server's version."""
    http = await site.client("acme")
    error = await refused(http, {"query": "SELECT version()"})
    assert error["code"] == "sql_function_refused", error


async def test_a_param_of_the_wrong_type_is_invalid_input_on_postgres(site: Site) -> None:
    """PostgreSQL types a ? by where it stands; a value of another type is
    the caller's mistake, which ``PgCatalogue.query`` means to answer as
    invalid_input naming params (its ``except (TypeError, ValueError,
    OverflowError)``). But asyncpg raises ``asyncpg.DataError``, a
    ``PostgresError``, for an argument it cannot encode, and the ``except
    (asyncpg.PostgresError, ...)`` before it answers sql_error naming the
    query. (SQLite compares any value with any: no error there.)"""
    await site.place("acme", *(o.event() for o in orders_of({"ann": 2})))
    http = await site.client("acme")
    body = {"query": 'SELECT id FROM "order".orders WHERE amount > ?', "params": ["abc"]}
    if not site.postgres:
        assert (await sql(http, body["query"], body["params"]))["rows"] == []
        return
    error = await refused(http, body)
    assert (error["code"], error["field"]) == ("invalid_input", "params"), error
