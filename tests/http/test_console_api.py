"""The API the console is a client of, against a real ``yoke serve --app
tests.http.console_app:app`` per backend: the tenant overview, an instance's
schedules, the read-only SQL query, a subscription's configuration history.

Each test works in a tenant of its own; the servers get databases of their
own (fan-out and deliveries span every tenant of a database).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from .conftest import Server
from .test_actors_api import Tenant, wait_for, wait_state
from .test_subscriptions_api import Hook


@pytest.fixture
def tenant(console_server: Server) -> Iterator[Tenant]:
    t = Tenant(console_server)
    try:
        yield t
    finally:
        t.http.close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    try:
        yield h
    finally:
        h.close()


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def overview(t: Tenant) -> dict[str, Any]:
    response = t.http.get("/v1/overview")
    assert response.status_code == 200, response.text
    return response.json()


def dead_flaky(t: Tenant) -> str:
    """A flaky instance with one dead row; its id."""
    t.append("/jobs", {"type": "flaky.fail", "payload": {"n": 1}})
    found = wait_for(lambda: t.http.get("/v1/instances", params={"actor": "flaky"}).json()["instances"], "flaky")
    instance_id = found[0]["id"]
    wait_for(lambda: t.show(instance_id)["queue"]["dead"] == 1, "the dead row")
    return instance_id


# --- the overview ------------------------------------------------------------------------


def test_overview_counts_the_tenants_streams_queues_tails_and_subscriptions(tenant, console_server, hook):
    empty = overview(tenant)
    assert {k: empty[k] for k in ("streams", "offsets", "open_tails", "queue", "dead_letters")} == {
        "streams": 0, "offsets": 0, "open_tails": 0, "queue": {"pending": 0, "processing": 0, "dead": 0},
        "dead_letters": [],
    }
    assert empty["subscriptions"] == {"count": 0, "halted": 0, "lag": 0, "attention": []}

    instance_id = dead_flaky(tenant)
    tenant.append("/a", {"type": "x"}, {"type": "y"})
    made = tenant.http.post("/v1/streams/a/-/subscriptions", json={
        "name": "out", "receiver": {"kind": "webhook", "url": hook.url}, "start": "beginning",
    })
    assert made.status_code == 201, made.text
    wait_for(lambda: tenant.http.get("/v1/streams/a/-/subscription", params={"name": "out"}).json()["halted"],
             "the webhook to halt")
    seen = overview(tenant)
    heads = {s["path"]: s["head"] for s in tenant.http.get("/v1/streams").json()["streams"]}
    assert seen["streams"] == len(heads) and seen["offsets"] == sum(heads.values())
    assert seen["queue"]["dead"] == 1 and seen["dead_letters"] == [{"instance_id": instance_id, "dead": 1}]
    subs = seen["subscriptions"]
    assert (subs["count"], subs["halted"]) == (1, 1) and subs["lag"] >= 2
    [attention] = subs["attention"]
    assert (attention["path"], attention["name"], attention["halted"]) == ("/a", "out", True)
    assert "answered 500" in attention["last_error"]
    assert seen["at"] >= empty["at"]

    # Open tails: this server's live tails of the tenant.
    opened = threading.Event()
    stop = threading.Event()

    def tail() -> None:
        with tenant.http.stream("GET", "/v1/streams/a/-/tail", params={"after": 0}) as response:
            for _ in response.iter_lines():
                opened.set()
                if stop.is_set():
                    return

    runner = threading.Thread(target=tail, daemon=True)
    runner.start()
    try:
        assert opened.wait(30)
        wait_for(lambda: overview(tenant)["open_tails"] == 1, "the open tail counted")
        other = Tenant(console_server)  # another tenant sees none of it
        assert overview(other)["open_tails"] == 0 and overview(other)["streams"] == 0
    finally:
        stop.set()
        runner.join(30)
    wait_for(lambda: overview(tenant)["open_tails"] == 0, "the closed tail uncounted")


def test_overview_needs_the_read_scope(tenant, console_server):
    reader = console_server.client(console_server.new_token(tenant.name, "read"))
    assert reader.get("/v1/overview").status_code == 200
    appender = console_server.client(console_server.new_token(tenant.name, "append"))
    assert error_of(appender.get("/v1/overview")) == (403, "forbidden")
    assert error_of(console_server.client("").get("/v1/overview")) == (401, "unauthorized")
    assert error_of(tenant.http.get("/v1/overview", params={"tenant": "other"})) == (403, "forbidden")


# --- schedules and the SQL query -----------------------------------------------------------


def ledger(t: Tenant) -> str:
    t.append("/books", {"type": "ledger.credit", "payload": {"amount": 5}},
             {"type": "ledger.debit", "payload": {"amount": -2}})
    found = wait_for(lambda: t.http.get("/v1/instances", params={"actor": "ledger"}).json()["instances"], "ledger")
    instance_id = found[0]["id"]
    wait_state(t, instance_id, lambda s: s.get("entries") == 2, "two entries")
    return instance_id


def sql(t: Tenant, instance_id: str, **body: Any) -> httpx.Response:
    return t.http.post(f"/v1/instances/{instance_id}/sql", json=body)


def test_schedules_of_an_instance(tenant):
    instance_id = ledger(tenant)
    response = tenant.http.get(f"/v1/instances/{instance_id}/schedules")
    assert response.status_code == 200, response.text
    [schedule] = response.json()["schedules"]
    assert (schedule["name"], schedule["cron"], schedule["stream"]) == ("daily-total", "0 9 * * *", None)
    assert schedule["event"]["type"] == "ledger.total" and schedule["due_at"] > time.time() * 1000
    assert error_of(tenant.http.get("/v1/instances/inst_nothing/schedules")) == (404, "instance_not_found")


def test_read_only_sql_over_an_instance_database(tenant, console_server):
    instance_id = ledger(tenant)
    response = sql(tenant, instance_id, sql="SELECT offset, type, amount FROM entries ORDER BY offset")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "columns": ["offset", "type", "amount"],
        "rows": [[1, "ledger.credit", 5], [2, "ledger.debit", -2]],
        "truncated": False,
    }
    one = sql(tenant, instance_id, sql="SELECT amount FROM entries WHERE type = ?", params=["ledger.debit"])
    assert one.json()["rows"] == [[-2]]
    capped = sql(tenant, instance_id, sql="SELECT * FROM entries", max_rows=1).json()
    assert len(capped["rows"]) == 1 and capped["truncated"] is True
    state = sql(tenant, instance_id, sql="SELECT version FROM _yoke_state").json()  # readable, not writable
    assert state["rows"] == [[2]]
    tables = sql(tenant, instance_id, sql="PRAGMA table_info(entries)").json()
    assert [r[1] for r in tables["rows"]] == ["offset", "type", "amount"]

    refused = [
        "DELETE FROM entries", "INSERT INTO entries VALUES (9, 'x', 1)", "UPDATE _yoke_state SET version = 9",
        "DROP TABLE entries", "CREATE TABLE t (a)", "ATTACH DATABASE '/tmp/x.db' AS x", "PRAGMA user_version = 7",
        "PRAGMA journal_mode = DELETE", "SELECT 1; DELETE FROM entries", "BEGIN", "VACUUM",
    ]
    for statement in refused:
        answered = sql(tenant, instance_id, sql=statement)
        assert error_of(answered) == (400, "invalid_input"), (statement, answered.text)
    assert sql(tenant, instance_id, sql="SELECT count(*) FROM entries").json()["rows"] == [[2]]  # all still there
    assert tenant.show(instance_id)["state"]["version"] == 2

    forever = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n"
    started = time.monotonic()
    timed_out = sql(tenant, instance_id, sql=forever, timeout_s=0.2)
    assert error_of(timed_out) == (400, "invalid_input") and "ran out of time" in timed_out.json()["error"]["message"]
    assert time.monotonic() - started < 10
    bad = [
        {"sql": ""}, {"sql": 1}, {"sql": "SELECT 1", "max_rows": 0}, {"sql": "SELECT 1", "max_rows": 10_001},
        {"sql": "SELECT 1", "timeout_s": 0}, {"sql": "SELECT 1", "timeout_s": 31}, {"sql": "SELECT ?", "params": [[1]]},
        {"sql": "SELECT ?", "params": [2**63]}, {"sql": "SELECT ?", "params": {"a": 1}}, {"sql": "SELECT \x00"},
        {"sql": "SELECT 1", "other": 1}, {"sql": "SELECT * FROM missing"},
    ]
    for body in bad:
        assert error_of(sql(tenant, instance_id, **body))[0] == 400, body
    assert error_of(sql(tenant, "inst_nothing", sql="SELECT 1")) == (404, "instance_not_found")

    reader = console_server.client(console_server.new_token(tenant.name, "read"))
    assert reader.post(f"/v1/instances/{instance_id}/sql", json={"sql": "SELECT 1"}).json()["rows"] == [[1]]
    stranger = Tenant(console_server)
    assert error_of(sql(stranger, instance_id, sql="SELECT 1")) == (404, "instance_not_found")


# --- a subscription's history --------------------------------------------------------------


def test_configuration_history_from_the_log(tenant, hook):
    http = tenant.http
    url = "/v1/streams/h/-/subscription"
    tenant.append("/h", {"type": "one"})
    assert http.post("/v1/streams/h/-/subscriptions", json={
        "name": "out", "receiver": {"kind": "webhook", "url": hook.url},
    }).status_code == 201
    assert http.post("/v1/streams/h/-/subscriptions", json={
        "name": "other", "receiver": {"kind": "copy", "target": "/h2"},
    }).status_code == 201
    tenant.append("/h", {"type": "two"})
    wait_for(lambda: http.get(url, params={"name": "out"}).json()["halted"], "the webhook to halt")
    hook.status = 204
    assert http.post(url + "/resume", params={"name": "out"}).status_code == 200
    assert http.post(url + "/cursor", params={"name": "out"}, json={"after_offset": 0}).status_code == 200

    page = http.get(url + "/history", params={"name": "out"}).json()
    assert [c["type"] for c in page["changes"]] == [
        "yoke.subscription.configured", "yoke.subscription.halted", "yoke.subscription.resumed",
        "yoke.subscription.cursor_set",
    ]
    assert all(c["payload"]["name"] == "out" for c in page["changes"])
    assert page["changes"][0]["payload"]["config"]["url"] == hook.url
    assert page["from_offset"] == 1 and page["scanned_through"] == page["head"]

    # Paged: two events at a time, read on from scanned_through.
    seen, after = [], 0
    while True:
        part = http.get(url + "/history", params={"name": "out", "after": after, "scan": 2}).json()
        seen += [c["offset"] for c in part["changes"]]
        if part["scanned_through"] == part["head"]:
            break
        assert part["scanned_through"] > after
        after = part["scanned_through"]
    assert seen == [c["offset"] for c in page["changes"]]

    assert http.delete(url, params={"name": "out"}).status_code == 204
    removed = http.get(url + "/history", params={"name": "out"}).json()  # the history outlives it
    assert removed["changes"][-1]["type"] == "yoke.subscription.removed"
    assert error_of(http.get("/v1/streams/nothing/-/subscription/history", params={"name": "out"})) == (
        404, "stream_not_found"
    )
    beyond = http.get(url + "/history", params={"name": "out", "after": page["head"] + 100})
    assert error_of(beyond) == (400, "invalid_cursor")
    assert http.get(url + "/history", params={"name": "out", "scan": 0}).status_code == 400
