"""``yoke sql``: the real CLI against a real ``yoke serve`` on each backend,
running the actor this module defines (``--app tests.cli.test_sql:app``).

Each test works in a tenant of its own (a token made with ``yoke tokens
create``); it appends its events over HTTP and polls ``POST /v1/sql`` until
the catalogue holds the rows it expects (with a deadline), then runs the
command as a user does.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.http.conftest import Server, own_database, start_server, stop_server
from yoke import App, Filter

from .conftest import FAST, Cli

app = App(name="clishop")


@app.actor("order", filter=Filter(types=["order.*"], key="payload.customer"))
async def order(ctx, event):
    await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER, note TEXT)")
    p = event.payload
    await ctx.sqlite.exec("INSERT OR REPLACE INTO orders (id, amount, note) VALUES (?, ?, ?)",
                          [p["id"], p["amount"], p.get("note")])
    await ctx.state.update(lambda s: {"orders": s.get("orders", 0) + 1})


APP = "tests.cli.test_sql:app"
DEADLINE_S = 30
# customer -> [(order id, amount, note)]
ORDERS = {
    "ann": [("ann-1", 12, "gift wrap"), ("ann-2", 30, None)],
    "bob": [("bob-1", 5, None), ("bob-2", 25, "rush"), ("bob-3", 40, None)],
    "cyd": [("cyd-1", 100, None)],
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def sql_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("cli-sql")
    with own_database(request.param, base, "yoke_cli_sql") as db_url:
        srv = start_server(db_url, base / ".yoke", args=("--app", APP), **FAST)
        try:
            yield srv
        finally:
            stop_server(srv)


class Shop:
    """A tenant of its own on the server, with its orders placed and mirrored."""

    def __init__(self, server: Server) -> None:
        self.cli = Cli(server)
        self.server = server
        self.tenant = "t" + uuid.uuid4().hex[:12]
        self.token = self.new_token("read,append")
        self.http = server.client(self.token)

    def new_token(self, scopes: str) -> str:
        made = self.cli.db("tokens", "create", "--tenant", self.tenant, "--scopes", scopes)
        return made.stdout.strip()

    def __call__(self, *args: str, check: bool = True, token: str | None = None):
        return self.cli(*args, check=check, YOKE_TOKEN=token or self.token)

    def query(self, query: str, params: list[Any] | None = None) -> dict[str, Any]:
        answer = self.http.post("/v1/sql", json={"query": query, "params": params or []})
        return {"status": answer.status_code, **answer.json()}

    def place(self, orders: dict[str, list[tuple[str, int, str | None]]]) -> None:
        events = [
            {"type": "order.placed", "payload": {"customer": c, "id": i, "amount": a, "note": n}}
            for c, placed in orders.items() for i, a, n in placed
        ]
        answer = self.http.post("/v1/streams/orders/-/events", json=events)
        assert answer.status_code == 201, answer.text
        want = sum(len(p) for p in orders.values())

        def mirrored() -> bool:
            # Every order, and every instance's state, in the catalogue.
            found = self.query('SELECT count(*) FROM "order".orders')
            states = self.query('SELECT sum(json_extract(value, \'$.orders\')) FROM "order".yoke_state'
                                if self.server.db_url.startswith("sqlite") else
                                'SELECT sum((value::jsonb->>\'orders\')::int) FROM "order".yoke_state')
            return found["status"] == 200 and found["rows"] == [[want]] and states.get("rows") == [[want]]

        wait_for(mirrored, f"{want} orders in the SQL catalogue")


def wait_for(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def shop(sql_server: Server) -> Iterator[Shop]:
    s = Shop(sql_server)
    try:
        yield s
    finally:
        s.http.close()


def totals() -> list[tuple[str, int, int]]:
    return [(c, len(p), sum(a for _, a, _ in p)) for c, p in sorted(ORDERS.items())]


# --- the rows ---------------------------------------------------------------------------


def test_a_table_of_rows(shop: Shop) -> None:
    shop.place(ORDERS)
    out = shop("sql", 'SELECT key, count(*) AS n, sum(amount) AS total FROM "order".orders GROUP BY key ORDER BY key')
    assert out.stderr == ""
    # The rows under their column names, left-aligned, two spaces apart.
    assert out.stdout.splitlines() == [
        "key  n  total",
        "ann  2  42",
        "bob  3  70",
        "cyd  1  100",
    ]
    assert out.stdout.splitlines()[1:] == [f"{c}  {n}  {t}" for c, n, t in totals()]

    # NULL for null; text as it is (spaces and all); a join with yoke.instances.
    out = shop("sql", 'SELECT o.id, o.note, i.actor FROM "order".orders o JOIN yoke.instances i USING (instance_id)'
                      " WHERE o.key = 'ann' ORDER BY o.id")
    assert out.stdout.splitlines() == [
        "id     note       actor",
        "ann-1  gift wrap  order",
        "ann-2  NULL       order",
    ]
    # No rows.
    assert shop("sql", 'SELECT id FROM "order".orders WHERE amount > 1000').stdout == "(no rows)\n"
    # --max-rows: the first N, and a last line saying they were cut.
    out = shop("sql", 'SELECT id FROM "order".orders ORDER BY amount DESC', "--max-rows", "2")
    assert out.stdout.splitlines() == ["id", "cyd-1", "bob-3", "(the first 2 rows: --max-rows for more)"]
    out = shop("sql", 'SELECT id FROM "order".orders ORDER BY amount DESC', "--max-rows", "6")
    assert out.stdout.splitlines()[-1] == "bob-1" and len(out.stdout.splitlines()) == 7


def test_json_lines_and_params(shop: Shop) -> None:
    shop.place(ORDERS)
    # --json: one JSON object per row, keyed by column name, nothing else on stdout.
    out = shop("sql", 'SELECT key, id, amount, note FROM "order".orders ORDER BY id', "--json")
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [
        {"key": c, "id": i, "amount": a, "note": n}
        for c, placed in sorted(ORDERS.items()) for i, a, n in placed
    ]
    # The state as JSON text, per instance.
    out = shop("sql", 'SELECT key, value FROM "order".yoke_state ORDER BY key', "--json")
    assert [(r["key"], json.loads(r["value"])) for r in map(json.loads, out.stdout.splitlines())] == [
        (c, {"orders": len(p)}) for c, p in sorted(ORDERS.items())
    ]
    # --json with a cut: the rows on stdout, the note on stderr.
    out = shop("sql", 'SELECT id FROM "order".orders ORDER BY id', "--json", "--max-rows", "1")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"id": "ann-1"}]
    assert out.stderr == "(the first 1 rows: --max-rows for more)\n"

    # --params: values for the ? marks, in order.
    out = shop("sql", 'SELECT id, amount FROM "order".orders WHERE key = ? AND amount >= ? ORDER BY id',
               "--params", '["bob", 20]', "--json")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"id": "bob-2", "amount": 25}, {"id": "bob-3", "amount": 40}
    ]
    out = shop("sql", 'SELECT count(*) AS n FROM "order".orders WHERE note = ?', "--params", '["gift wrap"]')
    assert out.stdout.splitlines() == ["n", "1"]
    # A param is a value, never SQL.
    out = shop("sql", 'SELECT count(*) AS n FROM "order".orders WHERE id = ?', "--params",
               json.dumps(['x\'; DELETE FROM "order".orders; --']))
    assert out.stdout.splitlines() == ["n", "0"]
    # --params must be a JSON list.
    bad = shop("sql", "SELECT ?", "--params", '{"a": 1}', check=False)
    assert bad.returncode != 0 and "--params is a JSON list" in bad.stderr and bad.stdout == ""
    bad = shop("sql", "SELECT ?", "--params", "[1,", check=False)
    assert bad.returncode != 0 and "--params is not valid JSON" in bad.stderr


def test_tables(shop: Shop) -> None:
    # Before any run in this tenant: Yoke's records only.
    yoke_tables = ["instances", "streams", "queue", "schedules", "subscriptions", "failures", "events"]
    assert shop("sql", "--tables").stdout.splitlines() == [f"yoke.{name}" for name in yoke_tables]
    shop.place({"ann": ORDERS["ann"]})
    lines = shop("sql", "--tables").stdout.splitlines()
    assert lines == [
        "order.orders (instance_id, key, id, amount, note)",
        "order.yoke_state (instance_id, key, value, version)",
        *[f"yoke.{name}" for name in yoke_tables],
    ]
    listed = [json.loads(line) for line in shop("sql", "--tables", "--json").stdout.splitlines()]
    assert listed[0] == {"schema": "order", "name": "orders", "columns": [
        {"name": "instance_id", "declared": "TEXT"}, {"name": "key", "declared": "TEXT"},
        {"name": "id", "declared": "TEXT"}, {"name": "amount", "declared": "INTEGER"},
        {"name": "note", "declared": "TEXT"},
    ]}
    assert [(t["schema"], t["name"]) for t in listed[2:]] == [("yoke", name) for name in yoke_tables]


def test_refused_queries_say_why_and_exit_non_zero(shop: Shop) -> None:
    shop.place({"bob": ORDERS["bob"]})
    for query, message in [
        ('DELETE FROM "order".orders', "error: sql_read_only (400): only queries are allowed, not DELETE"),
        ("SELECT 1; SELECT 2", "error: sql_one_statement (400): send exactly one statement"),
        ("SELECT * FROM orders", "error: sql_unknown_table (400): no table 'orders': name tables as ACTOR.TABLE"
                                 " (an actor's) or yoke.TABLE (Yoke's records)"),
        ('SELECT * FROM "order".nope', "error: sql_unknown_table (400): no table order.nope"),
        ("SELECT * FROM yoke.events", "error: sql_events_unbounded (400): yoke.events is read one stream at a time"),
        ("SELECT load_extension('x')", "error: sql_function_refused (400): the function load_extension()"
                                       " is not allowed in a query"),
        ("SELECT pg_read_file('/etc/passwd')", "error: sql_function_refused (400): the function pg_read_file()"),
    ]:
        done = shop("sql", query, check=False)
        assert done.returncode == 1, (query, done.stdout, done.stderr)
        assert done.stdout == "" and done.stderr.startswith(message), (query, done.stderr)
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    # A query past its --timeout.
    started = time.monotonic()
    done = shop("sql", "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n",
                "--timeout", "0.3", check=False)
    assert done.returncode == 1 and done.stderr.startswith("error: sql_timeout (400): the query ran out of time")
    assert time.monotonic() - started < 15
    # No query at all; a token without the read scope.
    done = shop("sql", check=False)
    assert done.returncode != 0 and "give a QUERY (or --tables)" in done.stderr
    done = shop("sql", "SELECT 1", check=False, token=shop.new_token("append"))
    assert done.returncode == 1 and done.stderr.startswith("error: forbidden (403)") and "read" in done.stderr
    # Nothing changed.
    out = shop("sql", 'SELECT id, amount FROM "order".orders ORDER BY id', "--json")
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"id": i, "amount": a} for i, a, _ in ORDERS["bob"]
    ]
