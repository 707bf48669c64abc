"""The console's SQL page in a real headless Chromium, against a real
``yoke serve --app tests.browser.sql_app:app`` on SQLite and PostgreSQL:
one query across every instance of a keyed actor's ``ctx.sqlite`` table.

The tables a query can name are listed (a click starts a query on one); an
aggregate (GROUP BY) shows the numbers the test computed; a result of more
than one page is paged here; a result cut at "At most" says so; a write is
refused with its error code on the page; the rows download as CSV. Markup in
a row stays text. Same rules as test_console.py: nothing beyond 127.0.0.1,
no script error, no browser console error but the 400s provoked on purpose.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.test_console import Console, poll, unique
from tests.http.conftest import CONSOLE_FAST, Server, own_database, start_server, stop_server

SQL_APP = "tests.browser.sql_app:app"
CUSTOMERS = ["c0", "c1", "c2", "c3"]
STATUSES = ["open", "paid", "refunded", "<img src=x onerror=window.__xss=1>"]
BATCHES = 3  # per customer
PER_BATCH = 11  # orders per batch: 4 x 3 x 11 = 132 rows, three pages of 50
ORDERS = '"order".orders'


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def sql_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``yoke serve --app tests.browser.sql_app:app`` on a database of its own."""
    base = tmp_path_factory.mktemp("console-sql")
    with own_database(request.param, base, "yoke_console_sql") as db_url:
        srv = start_server(db_url, base / ".yoke", args=("--app", SQL_APP, "--print-token"), **CONSOLE_FAST)
        try:
            yield srv
        finally:
            stop_server(srv)


@pytest.fixture
def console(page: Any, sql_server: Server, offline: Any) -> Console:
    return Console(page, sql_server, offline)


def orders() -> list[dict[str, Any]]:
    """Every order the test appends: (customer, n, status, total), n unique per customer."""
    made = []
    for c, customer in enumerate(CUSTOMERS):
        for n in range(1, BATCHES * PER_BATCH + 1):
            made.append({"customer": customer, "n": n, "status": STATUSES[(n + c) % len(STATUSES)],
                         "total": n * 10 + c})
    return made


def sql(console: Console, query: str, **options: Any) -> dict[str, Any]:
    answer = console.api.post("/v1/sql", json={"query": query, **options})
    assert answer.status_code == 200, answer.text
    return answer.json()


def rows_shown(page: Any) -> list[list[str]]:
    return page.eval_on_selector_all(
        "#query-rows tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))")


def test_a_query_across_every_instance_paged_refused_and_exported(console: Console) -> None:
    page = console.page
    console.sign_in_to_a_new_tenant()  # its own instances: the numbers are this test's
    placed = orders()
    path = unique("orders")
    for customer in CUSTOMERS:
        mine = [o for o in placed if o["customer"] == customer]
        console.append(path, *({"type": "order.batch", "payload": {
            "customer": customer, "orders": [{k: o[k] for k in ("n", "status", "total")} for o in chunk]}}
            for chunk in (mine[i:i + PER_BATCH] for i in range(0, len(mine), PER_BATCH))))
    # The runs' changes reach the catalogue within about a second (the table
    # is unknown until the first instance's first rows reach it).
    def counted() -> Any:
        answer = console.api.post("/v1/sql", json={"query": f"SELECT count(*) FROM {ORDERS}"})
        if answer.status_code == 400 and answer.json()["error"]["code"] == "sql_unknown_table":
            return None
        assert answer.status_code == 200, answer.text
        return answer.json()["rows"]

    poll(lambda: counted() == [[len(placed)]], "every order queryable")

    console.open("#/sql")
    expect(page.locator('#nav a[data-page="sql"]')).to_have_attribute("aria-current", "page")
    tables = page.locator("#tables")
    expect(tables.locator(f"[data-table='{ORDERS}']")).to_be_visible()
    expect(tables.locator("[data-table='\"order\".yoke_state']")).to_be_visible()
    expect(tables.locator('[data-schema="order"]')).to_contain_text("instance_id, key, n, status, total")
    for name in ("instances", "streams", "queue", "schedules", "subscriptions", "failures", "events"):
        expect(tables.locator(f"[data-table='yoke.{name}']")).to_be_visible()

    # An aggregate over every instance: the numbers the test computed.
    groups: dict[str, dict[str, Any]] = defaultdict(lambda: {"orders": 0, "amount": 0, "customers": set()})
    for o in placed:
        group = groups[o["status"]]
        group["orders"] += 1
        group["amount"] += o["total"]
        group["customers"].add(o["customer"])
    expected = sorted([status, str(g["orders"]), str(g["amount"]), str(len(g["customers"]))]
                      for status, g in groups.items())
    page.locator("#query").fill(
        "SELECT status, count(*) AS orders, sum(total) AS amount, count(DISTINCT key) AS customers\n"
        f"FROM {ORDERS} GROUP BY status")
    page.locator("#query").press("Control+Enter")
    expect(page.locator("#query-rows thead th")).to_have_text(["status", "orders", "amount", "customers"])
    expect(page.locator("#query-rows tbody tr")).to_have_count(len(STATUSES))
    assert sorted(rows_shown(page)) == expected
    expect(page.locator("#query-range")).to_have_text(f"rows 1–{len(STATUSES)} of {len(STATUSES)}")
    expect(page.locator("#query-result")).not_to_contain_text("null")
    # A status that looks like markup is text.
    assert page.locator("main img").count() == 0 and page.evaluate("window.__xss") is None
    console.shot("sql-aggregate")

    # A click on a table starts a query on it.
    tables.locator(f"[data-table='{ORDERS}']").click()
    expect(page.locator("#query")).to_have_value(f"SELECT * FROM {ORDERS} LIMIT 100")
    expect(page.locator("#query-range")).to_have_text("rows 1–50 of 100")
    expect(page.locator("#query-rows thead th")).to_have_text(["instance_id", "key", "n", "status", "total"])
    # yoke.events is read one stream at a time: its query waits for the path, selected to be typed over.
    tables.locator("[data-table='yoke.events']").click()
    expect(page.locator("#query")).to_have_value("SELECT * FROM yoke.events WHERE path = '/your/stream' LIMIT 100")
    assert page.evaluate("() => { const t = document.querySelector('#query');"
                         " return t.value.slice(t.selectionStart, t.selectionEnd); }") == "/your/stream"
    page.keyboard.type(path)
    page.keyboard.press("Control+Enter")
    expect(page.locator("#query-range")).to_have_text(f"rows 1–{len(CUSTOMERS) * BATCHES} of {len(CUSTOMERS) * BATCHES}")

    # More than one page, paged here.
    everything = sorted(placed, key=lambda o: (o["customer"], o["n"]))
    cells = [[o["customer"], str(o["n"]), o["status"], str(o["total"])] for o in everything]
    page.locator("#query").fill(f"SELECT key, n, status, total FROM {ORDERS} ORDER BY key, n")
    page.get_by_role("button", name="Run").click()
    range_ = page.locator("#query-range")
    expect(range_).to_have_text(f"rows 1–50 of {len(placed)}")
    expect(page.locator("#query-summary")).to_contain_text(f"{len(placed)} rows")
    expect(page.locator("#query-rows tbody tr")).to_have_count(50)
    assert rows_shown(page) == cells[:50]
    expect(page.locator("#query-previous")).to_be_disabled()
    page.locator("#query-next").click()
    expect(range_).to_have_text(f"rows 51–100 of {len(placed)}")
    assert rows_shown(page) == cells[50:100]
    page.locator("#query-next").click()
    expect(range_).to_have_text(f"rows 101–{len(placed)} of {len(placed)}")
    expect(page.locator("#query-rows tbody tr")).to_have_count(len(placed) - 100)
    assert rows_shown(page) == cells[100:]
    expect(page.locator("#query-next")).to_be_disabled()
    console.shot("sql-last-page")
    page.locator("#query-previous").click()
    expect(range_).to_have_text(f"rows 51–100 of {len(placed)}")
    expect(page.locator("#query-truncated")).to_have_count(0)

    # The query is in the address: a reload runs it again.
    page.reload()
    console.wait("sql")
    expect(page.locator("#query")).to_have_value(f"SELECT key, n, status, total FROM {ORDERS} ORDER BY key, n")
    expect(range_).to_have_text(f"rows 1–50 of {len(placed)}")

    # Cut at "At most": said so.
    page.locator("#query-max").fill("120")
    page.get_by_role("button", name="Run").click()
    expect(page.locator("#query-truncated")).to_contain_text("more rows matched than the 120 asked for")
    expect(range_).to_have_text("rows 1–50 of 120")

    # The rows as CSV: the query shown, downloaded.
    page.locator("#query-max").fill("1000")
    page.get_by_role("button", name="Run").click()
    expect(page.locator("#query-truncated")).to_have_count(0)
    expect(range_).to_have_text(f"rows 1–50 of {len(placed)}")
    with page.expect_download() as downloading:
        page.get_by_role("button", name="Export CSV").click()
    download = downloading.value
    assert download.suggested_filename.startswith("yoke-sql-") and download.suggested_filename.endswith(".csv")
    text = Path(download.path()).read_text(encoding="utf-8")
    assert list(csv.reader(io.StringIO(text))) == [["key", "n", "status", "total"], *cells]
    expect(page.locator("#query-exported")).to_contain_text(download.suggested_filename)

    # A write is refused, its code and message shown in place.
    console.offline.errors_expected.add("400")
    page.locator("#query").fill(f"DELETE FROM {ORDERS}")
    page.get_by_role("button", name="Run").click()
    error = page.locator("#query-form .error")
    expect(error).to_be_visible()
    expect(error.locator("code")).to_have_text("sql_read_only")
    expect(error).to_contain_text("only queries are allowed")
    expect(page.locator("#query-rows")).to_have_count(0)
    console.shot("sql-refused")
    # A query that names no known table is refused the same way.
    page.locator("#query").fill('SELECT * FROM "order".nothing_here')
    page.locator("#query").press("Control+Enter")
    expect(error.locator("code")).to_have_text("sql_unknown_table")
    assert sql(console, f"SELECT count(*) FROM {ORDERS}")["rows"] == [[len(placed)]]

    # On a phone: the tables above the query, nothing wider than the screen.
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("#query").fill(f"SELECT * FROM {ORDERS}")
    page.get_by_role("button", name="Run").click()
    expect(range_).to_have_text(f"rows 1–50 of {len(placed)}")
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    console.shot("sql-phone")
