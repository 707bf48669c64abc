"""Actors over HTTP: a real ``yoke serve --app tests.http.actor_app:app`` per
backend (instances, queues, dead letters, portals, the CLI), and the
control-plane / executor split (``yoke serve --no-executor`` + ``yoke worker``).

Each test works in a tenant of its own (a token made for it); the servers
get PostgreSQL databases of their own, since fan-out and workers span every
tenant of a database.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import jsonata
import orjson
import pytest

import yoke

from .conftest import Server, own_database, start_server, stop_server

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.http.actor_app:app"
FAST = {
    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    "YOKE_SCHEDULER_SWEEP_S": "0.05",
    "YOKE_WORKER_HEARTBEAT_S": "0.2",
    "YOKE_METRICS_SAMPLE_S": "0.1",
}
DEADLINE_S = 20


# --- databases, servers, tenants ------------------------------------------------------


def database(kind: str, base: Path) -> contextlib.AbstractContextManager[str]:
    return own_database(kind, base, "yoke_http_actors")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def actors_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("actors")
    with database(request.param, base) as db_url:
        srv = start_server(db_url, base / ".yoke", args=("--app", APP), **FAST)
        try:
            yield srv
        finally:
            stop_server(srv)


def make_token(db_url: str, tenant: str, scopes: str = "admin") -> str:
    async def create() -> str:
        async with yoke.open(db_url) as y:
            return (await y.tokens.create(tenant, scopes.split(","), "actors api test")).token

    return asyncio.run(create())


class Tenant:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.name = "t" + uuid.uuid4().hex[:12]
        self.token = make_token(server.db_url, self.name)
        self.http = server.client(self.token)

    def create(self, actor: str, **body: Any) -> dict[str, Any]:
        response = self.http.post("/v1/instances", json={"actor": actor, **body})
        assert response.status_code in (200, 201), response.text
        return response.json()

    def show(self, instance_id: str) -> dict[str, Any]:
        response = self.http.get(f"/v1/instances/{instance_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def append(self, path: str, *events: dict[str, Any]) -> None:
        response = self.http.post(f"/v1/streams{path}/-/events", json=list(events))
        assert response.status_code == 201, response.text

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.server.cli(*args, "--url", self.server.url, "--token", self.token, check=check)

    def cli_many(self, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
        """Independent CLI commands run at once (each starts a Python process)."""
        with ThreadPoolExecutor(len(commands)) as pool:
            return list(pool.map(lambda args: self.cli(*args, check=False), commands))


@pytest.fixture
def tenant(actors_server: Server) -> Iterator[Tenant]:
    t = Tenant(actors_server)
    try:
        yield t
    finally:
        t.http.close()


def wait_for(check: Callable[[], Any], what: str, timeout_s: float = DEADLINE_S) -> Any:
    """Poll ``check`` until it returns something truthy; fail after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def wait_state(
    t: Tenant, instance_id: str, done: Callable[[Any], bool], what: str, timeout_s: float = DEADLINE_S
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        shown = t.show(instance_id)
        return shown if done(shown["state"]["value"] or {}) else None

    return wait_for(check, what, timeout_s)


def wait_settled(t: Tenant, instance_id: str, done: Callable[[Any], bool], what: str) -> dict[str, Any]:
    """The state satisfies ``done`` and no row is pending or processing (a
    finished row is deleted just after its state was written)."""

    def check() -> dict[str, Any] | None:
        shown = t.show(instance_id)
        idle = shown["queue"]["pending"] == shown["queue"]["processing"] == 0
        return shown if idle and done(shown["state"]["value"] or {}) else None

    return wait_for(check, what)


def wait_dead(t: Tenant, instance_id: str, count: int) -> dict[str, Any]:
    return wait_for(
        lambda: (s := t.show(instance_id))["queue"]["dead"] == count and s["queue"]["pending"] == 0
        and s["queue"]["processing"] == 0 and s,
        f"{count} dead row(s)",
    )


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# --- instances ------------------------------------------------------------------------


def test_create_list_and_show_instances(tenant):
    first = tenant.http.post("/v1/instances", json={"actor": "counter", "key": "a", "config": {"x": 1}})
    assert first.status_code == 201
    a = first.json()
    assert a["created"] is True and a["id"].startswith("inst_")
    assert (a["actor"], a["key"], a["config"], a["parent_id"]) == ("counter", "a", {"x": 1}, None)
    assert a["filter"] == {"types": ["count.*"]}  # the actor's filter
    assert a["worker_id"].startswith("wrk_")  # owned by the server's executor
    again = tenant.http.post("/v1/instances", json={"actor": "counter", "key": "a"})
    assert again.status_code == 200
    assert again.json() == {**a, "created": False}
    own_filter = {"types": ["count.special"], "streams": ["/special/**"], "where": "payload.n > 1"}
    b = tenant.create("counter", key="b", filter=own_filter)
    assert b["filter"] == own_filter
    generated = tenant.create("flaky")
    assert generated["created"] and generated["key"]

    listed = tenant.http.get("/v1/instances").json()["instances"]
    assert [i["id"] for i in listed] == sorted(i["id"] for i in (a, b, generated))
    assert {i["id"]: i for i in listed}[a["id"]] == {k: v for k, v in a.items() if k != "created"}
    counters = tenant.http.get("/v1/instances", params={"actor": "counter"}).json()["instances"]
    assert {i["key"] for i in counters} == {"a", "b"}
    page = tenant.http.get("/v1/instances", params={"limit": 1}).json()["instances"]
    rest = tenant.http.get("/v1/instances", params={"after": page[0]["id"]}).json()["instances"]
    assert [i["id"] for i in page + rest] == [i["id"] for i in listed]

    shown = tenant.show(a["id"])
    assert shown["state"] == {"value": None, "version": 0}
    assert shown["queue"] == {"pending": 0, "processing": 0, "dead": 0}
    assert {k: v for k, v in shown.items() if k not in ("state", "queue")} == {
        k: v for k, v in a.items() if k != "created"
    }


def test_remove_an_instance_records_the_fact(tenant):
    a = tenant.create("counter", key="gone")
    removed = tenant.http.delete(f"/v1/instances/{a['id']}")
    assert removed.status_code == 200 and removed.json()["id"] == a["id"]
    assert error_of(tenant.http.get(f"/v1/instances/{a['id']}")) == (404, "instance_not_found")
    assert error_of(tenant.http.delete(f"/v1/instances/{a['id']}")) == (404, "instance_not_found")
    facts = tenant.http.get("/v1/streams/-/events").json()["events"]
    removed_facts = [e for e in facts if e["type"] == "yoke.instance.removed"]
    assert [e["payload"]["instance_id"] for e in removed_facts] == [a["id"]]
    assert a["id"] in [e["payload"]["instance_id"] for e in facts if e["type"] == "yoke.instance.created"]
    # The CLI, by id or ACTOR/KEY.
    b = tenant.create("counter", key="cli-gone")
    out = tenant.cli("instances", "remove", "counter/cli-gone")
    assert out.stdout.strip() == f"removed {b['id']} (actor counter, key cli-gone)"
    gone = tenant.cli("instances", "remove", b["id"], check=False)
    assert gone.returncode != 0 and "instance_not_found" in gone.stderr + gone.stdout


def test_find_an_instance_by_actor_and_key(tenant):
    a = tenant.create("counter", key="k/with/slashes")
    found = tenant.http.get("/v1/instances", params={"actor": "counter", "key": "k/with/slashes"})
    assert [i["id"] for i in found.json()["instances"]] == [a["id"]]
    none = tenant.http.get("/v1/instances", params={"actor": "counter", "key": "nobody"})
    assert none.json() == {"instances": []}
    alone = tenant.http.get("/v1/instances", params={"key": "k"})
    assert error_of(alone) == (400, "invalid_input") and "actor" in alone.json()["error"]["message"]
    # The CLI takes ACTOR/KEY wherever it takes an instance id.
    shown, missing, dead = tenant.cli_many(
        ("instances", "show", "counter/k/with/slashes", "--json"), ("instances", "show", "counter/nobody"),
        ("dlq", "list", "counter/k/with/slashes"),
    )
    assert orjson.loads(shown.stdout)["id"] == a["id"]
    assert missing.returncode == 1 and "no counter instance with key 'nobody'" in missing.stderr
    assert dead.returncode == 0 and "no dead rows" in dead.stdout


def test_appended_events_reach_the_actor(tenant):
    inst = tenant.create("counter", key="c")
    tenant.append("/orders", {"type": "count.one", "payload": 1}, {"type": "other.thing"})
    tenant.append("/orders/eu", {"type": "count.two", "payload": {"n": 2}})
    shown = wait_settled(tenant, inst["id"], lambda s: s.get("n") == 2, "two count events processed")
    assert shown["state"]["value"] == {"n": 2, "last": {"n": 2}, "path": "/orders/eu"}
    assert shown["state"]["version"] == 2
    assert shown["queue"] == {"pending": 0, "processing": 0, "dead": 0}


# --- dead letters -----------------------------------------------------------------------


def test_dead_letters_list_redrive_and_drop(tenant):
    inst = tenant.create("flaky", key="f")
    iid = inst["id"]
    tenant.append("/jobs", {"type": "flaky.fail", "payload": "first"}, {"type": "flaky.fail", "payload": "second"})
    wait_dead(tenant, iid, 2)

    rows = tenant.http.get(f"/v1/instances/{iid}/dlq").json()["rows"]
    assert [r["event"]["payload"] for r in rows] == ["first", "second"]
    first, second = rows
    assert set(first) == {
        "qid", "status", "attempts", "group_id", "priority", "path", "offset", "event", "available_at",
        "last_error", "last_traceback", "enqueued_at", "started_at",
    }
    assert (first["status"], first["attempts"], first["path"], first["offset"]) == ("dead", 2, "/jobs", 1)
    assert first["last_error"] == "RuntimeError: flaky refuses first"
    assert "RuntimeError" in first["last_traceback"] and first["started_at"] >= first["enqueued_at"]
    assert first["event"]["type"] == "flaky.fail"
    assert tenant.http.get(f"/v1/instances/{iid}/queue", params={"status": "dead"}).json()["rows"] == rows
    assert tenant.http.get(f"/v1/instances/{iid}/queue", params={"status": "pending"}).json()["rows"] == []
    assert tenant.http.get(f"/v1/instances/{iid}/queue").json()["rows"] == rows

    # Drop one by qid (a qid that is not dead is ignored).
    dropped = tenant.http.post(f"/v1/instances/{iid}/dlq/drop", json={"qids": [first["qid"], 10**12]})
    assert dropped.json() == {"dropped": 1}
    assert [r["qid"] for r in tenant.http.get(f"/v1/instances/{iid}/dlq").json()["rows"]] == [second["qid"]]

    # Heal the actor, then redrive everything (no body): the row succeeds.
    tenant.append("/jobs", {"type": "flaky.heal"})
    wait_state(tenant, iid, lambda s: s.get("healed"), "the heal event")
    assert tenant.http.post(f"/v1/instances/{iid}/dlq/redrive").json() == {"redriven": 1}
    shown = wait_settled(tenant, iid, lambda s: s.get("done") == 1, "the redriven row to succeed")
    assert shown["queue"] == {"pending": 0, "processing": 0, "dead": 0}
    assert tenant.http.post(f"/v1/instances/{iid}/dlq/redrive", json={}).json() == {"redriven": 0}
    assert tenant.http.post(f"/v1/instances/{iid}/dlq/drop", json={"qids": []}).json() == {"dropped": 0}


def test_kept_inputs_over_http_and_the_cli(tenant, actors_server):
    iid = tenant.create("flaky", key="inputs")["id"]
    tenant.append("/kept", {"type": "flaky.fail", "payload": "one"})
    wait_dead(tenant, iid, 1)
    tenant.append("/kept", {"type": "flaky.heal"})
    wait_state(tenant, iid, lambda s: s.get("healed"), "the heal event")
    assert tenant.http.post(f"/v1/instances/{iid}/dlq/redrive").json() == {"redriven": 1}
    wait_settled(tenant, iid, lambda s: s.get("done") == 1, "the redriven row to succeed")

    page = tenant.http.get(f"/v1/instances/{iid}/inputs").json()
    assert page["next_after"] is None
    assert [(i["seq"], i["event"]["type"], i["outcome"], i["attempts"]) for i in page["inputs"]] == [
        (1, "flaky.fail", "dead", 2), (2, "flaky.heal", "done", 1), (3, "flaky.fail", "done", 1)
    ]
    first = page["inputs"][0]
    assert (first["kind"], first["path"], first["offset"], first["error"]) == (
        "event", "/kept", 1, "RuntimeError: flaky refuses one"
    )
    assert set(first) == {
        "seq", "kind", "path", "offset", "event", "attempts", "outcome", "error", "enqueued_at", "started_at",
        "processed_at", "code_version", "ops",
    }
    paged = tenant.http.get(f"/v1/instances/{iid}/inputs", params={"after": 1, "limit": 1}).json()
    assert [i["seq"] for i in paged["inputs"]] == [2] and paged["next_after"] == 2

    # A read token lists them; another tenant's token does not find the instance.
    reader = actors_server.client(make_token(actors_server.db_url, tenant.name, "read"))
    other = actors_server.client(make_token(actors_server.db_url, "t" + uuid.uuid4().hex[:12], "admin"))
    try:
        assert reader.get(f"/v1/instances/{iid}/inputs").json() == page
        assert error_of(other.get(f"/v1/instances/{iid}/inputs")) == (404, "instance_not_found")
    finally:
        reader.close()
        other.close()
    for params in ({"limit": 0}, {"after": -1}, {"upto": "x"}):
        assert error_of(tenant.http.get(f"/v1/instances/{iid}/inputs", params=params)) == (400, "invalid_input")

    # The CLI, by ACTOR/KEY: a table, and a page as JSON.
    shown = tenant.cli("instances", "inputs", "flaky/inputs").stdout
    assert "/kept@1" in shown and "dead: RuntimeError: flaky refuses one" in shown and shown.count("done") == 2
    assert orjson.loads(tenant.cli("instances", "inputs", "flaky/inputs", "--after", "2", "--json").stdout) == {
        "inputs": page["inputs"][2:], "next_after": None
    }
    assert "(more: --after 1)" in tenant.cli("instances", "inputs", iid, "--limit", "1").stdout


def test_forks_over_http_with_their_scopes(tenant, actors_server):
    iid = tenant.create("counter", key="forked")["id"]
    tenant.append("/forked", {"type": "count.one", "payload": 1}, {"type": "count.two", "payload": 2})
    wait_settled(tenant, iid, lambda s: s.get("n") == 2, "two count events processed")
    tokens = {scope: make_token(actors_server.db_url, tenant.name, scope) for scope in ("read", "append")}
    reader, appender = (actors_server.client(tokens[s]) for s in ("read", "append"))
    try:
        assert error_of(reader.post(f"/v1/instances/{iid}/forks")) == (403, "forbidden")
        made = appender.post(f"/v1/instances/{iid}/forks",
                             json={"edits": [{"seq": 2, "action": "replace", "payload": {"n": 9}}]})
        assert made.status_code == 201, made.text
        fork = made.json()
        assert (fork["instance_id"], fork["actor"], fork["key"], fork["app"]) == (iid, "counter", "forked", None)
        assert fork["summary"] == {"runs": 2, "failed": 0, "effects": 0, "refused": 0, "inputs": 2, "through": 2}
        fid = fork["fork_id"]
        # Naming other code imports it into the server: admin only.
        assert error_of(appender.post(f"/v1/instances/{iid}/forks", json={"app": APP})) == (403, "forbidden")
        same = tenant.http.post(f"/v1/instances/{iid}/forks", json={"app": APP, "upto": 1})
        assert same.status_code == 201 and same.json()["app"] == APP and same.json()["summary"]["runs"] == 1

        assert [f["fork_id"] for f in reader.get("/v1/forks", params={"instance_id": iid}).json()["forks"]] == sorted(
            [fid, same.json()["fork_id"]])
        assert reader.get(f"/v1/forks/{fid}").json() == fork
        assert reader.get(f"/v1/forks/{fid}/state").json() == {
            "value": {"n": 2, "last": {"n": 9}, "path": "/forked"}, "version": 2}
        runs = reader.get(f"/v1/forks/{fid}/runs", params={"limit": 1}).json()
        assert [r["seq"] for r in runs["runs"]] == [1] and runs["next_after"] == 1
        assert reader.post(f"/v1/forks/{fid}/sql", json={"sql": "SELECT 1 AS one"}).json()["rows"] == [[1]]
        diff = reader.get(f"/v1/forks/{fid}/diff").json()
        assert diff["changed"] is True and diff["state"]["changed"] == {"last": {"live": 2, "fork": {"n": 9}}}
        assert reader.get(f"/v1/forks/{fid}/diff", params={"against": same.json()["fork_id"]}).json()["changed"]

        other = actors_server.client(make_token(actors_server.db_url, "t" + uuid.uuid4().hex[:12], "admin"))
        try:
            assert error_of(other.get(f"/v1/forks/{fid}")) == (404, "fork_not_found")
            assert error_of(other.post(f"/v1/instances/{iid}/forks")) == (404, "instance_not_found")
        finally:
            other.close()
        for bad in ({"upto": -1}, {"edits": [{"seq": 1, "action": "bend"}]}, {"colour": 1}, {"app": 7},
                    {"app": "no_such_module_anywhere:app"}, {"app": "os:path"}, {"upto": 2**63}):
            assert error_of(tenant.http.post(f"/v1/instances/{iid}/forks", json=bad)) == (400, "invalid_input"), bad
        # The deploy check over HTTP (admin: it loads the candidate code), in the token's tenant.
        check = tenant.http.post("/v1/deploy-checks", json={"app": APP, "actors": ["counter"]})
        assert check.status_code == 200, check.text
        assert (check.json()["diverged"], check.json()["checked"]) == (0, 1)
        assert [t["tenant"] for t in check.json()["tenants"]] == [tenant.name]
        assert error_of(appender.post("/v1/deploy-checks", json={"app": APP})) == (403, "forbidden")
        for bad in ({}, {"app": APP, "instances": 0}, {"app": APP, "actors": "counter"}, {"app": APP, "x": 1}):
            assert error_of(tenant.http.post("/v1/deploy-checks", json=bad)) == (400, "invalid_input"), bad
        assert error_of(reader.delete(f"/v1/forks/{fid}")) == (403, "forbidden")
        assert appender.delete(f"/v1/forks/{fid}").json()["fork_id"] == fid
        assert error_of(reader.get(f"/v1/forks/{fid}")) == (404, "fork_not_found")
    finally:
        reader.close()
        appender.close()

    # The CLI: a fork by ACTOR/KEY, then its diff for people (and for a CI job: --exit-code).
    made = tenant.cli("instances", "fork", "counter/forked", "--replace", '2={"n": 5}').stdout
    fid = re.search(r"yoke forks diff (fork_\w+)", made).group(1)
    shown = tenant.cli("forks", "diff", fid, check=False)
    assert "differs" in shown.stdout and '~ last: 2 -> {"n":5}' in shown.stdout and shown.returncode == 0
    assert tenant.cli("forks", "diff", fid, "--exit-code", check=False).returncode == 1
    unchanged = tenant.cli("instances", "fork", "counter/forked", "--replace", "1=7", "--json").stdout
    same = orjson.loads(unchanged)["fork_id"]  # the first payload is overwritten by the second's: no difference
    assert "no difference" in tenant.cli("forks", "diff", same, "--exit-code").stdout
    listed = tenant.cli("forks", "list").stdout
    assert fid in listed and "counter/forked" in listed


def test_cli_instances_and_dlq(tenant):
    created = orjson.loads(tenant.cli("instances", "create", "flaky", "--key", "k", "--json").stdout)
    iid = created["id"]
    assert (created["created"], created["actor"], created["key"]) == (True, "flaky", "k")
    tenant.append("/cli", {"type": "flaky.fail", "payload": 1}, {"type": "flaky.fail", "payload": 2})
    wait_dead(tenant, iid, 2)

    listed, shown, dead = tenant.cli_many(
        ("instances", "list", "--actor", "flaky"), ("instances", "show", iid), ("dlq", "list", iid)
    )
    assert iid in listed.stdout and " k " in listed.stdout
    assert "0 pending, 0 processing, 2 dead" in shown.stdout
    assert dead.stdout.count("flaky refuses") == 2 and "/cli@1" in dead.stdout

    first = tenant.http.get(f"/v1/instances/{iid}/dlq").json()["rows"][0]
    out = tenant.cli("dlq", "drop", iid, "--qid", str(first["qid"]))
    assert out.stdout.strip() == f"dropped 1 row(s) of {iid}"
    tenant.append("/cli", {"type": "flaky.heal"})
    wait_state(tenant, iid, lambda s: s.get("healed"), "the heal event")
    out = tenant.cli("dlq", "redrive", iid, "--json")
    assert orjson.loads(out.stdout) == {"redriven": 1}
    wait_state(tenant, iid, lambda s: s.get("done") == 1, "the redriven row to succeed")


# --- portals -----------------------------------------------------------------------------


def test_portal_appends_an_event_the_actor_processes(tenant, actors_server):
    inst = tenant.create("counter", key="hooked", filter={"types": ["count.hook"]})
    signed = {"X-Signature": "ok"}
    answer = tenant.http.post("/v1/portals/hooks/inbox", json={"pr": 7}, headers=signed)
    assert answer.status_code == 202
    assert answer.json() == {"tenant": tenant.name, "stream": "/hooks/inbox", "offset": 1, "id": answer.json()["id"]}
    shown = wait_state(tenant, inst["id"], lambda s: s.get("n") == 1, "the portal's event processed")
    assert shown["state"]["value"]["last"] == {"pr": 7}

    # Without a Yoke token (a webhook sender): the portal's own tenant.
    path = "/hooks/" + uuid.uuid4().hex[:12]
    with httpx.Client(base_url=actors_server.url, timeout=30) as anonymous:
        answer = anonymous.post(f"/v1/portals{path}", json={"anon": True}, headers=signed)
        assert answer.status_code == 202 and answer.json()["tenant"] == "default"
        # A bearer credential that is not a Yoke token is the sender's own business.
        foreign = anonymous.post(
            f"/v1/portals{path}?quiet=1", json={"anon": 2},
            headers={**signed, "Authorization": "Bearer github-sends-this"},
        )
        assert foreign.status_code == 204 and foreign.content == b""
        refused = anonymous.post("/v1/portals/hooks/x", json={}, headers={"X-Signature": "forged"})
        assert (refused.status_code, refused.json()) == (401, {"error": "bad signature"})
        echo = anonymous.get("/v1/portals/hooks/a/b", params={"q": "1"})
        assert echo.json() == {"tenant": "default", "path": "/a/b", "query": {"q": "1"}}
        assert anonymous.get("/v1/portals/hooks").json()["path"] == "/"
        not_json = anonymous.post("/v1/portals/hooks/x", content=b"{nope", headers=signed)
        assert error_of(not_json) == (400, "invalid_input")
        for url in ("/v1/portals/nope", "/v1/portals/nope/a/b"):
            assert error_of(anonymous.post(url, json={})) == (404, "portal_not_found")
            assert error_of(anonymous.get(url)) == (404, "portal_not_found")
    events = actors_server.client().get(f"/v1/streams{path}/-/events").json()["events"]
    assert [e["payload"] for e in events] == [{"anon": True}, {"anon": 2}]

    read_only = make_token(actors_server.db_url, tenant.name, "read")
    with actors_server.client(read_only) as c:
        assert error_of(c.post("/v1/portals/hooks/x", json={}, headers=signed)) == (403, "forbidden")


# --- errors --------------------------------------------------------------------------------


def test_error_answers(tenant, actors_server):
    http = tenant.http
    inst = tenant.create("counter", key="e")
    for method, suffix in [
        ("GET", ""), ("GET", "/queue"), ("GET", "/dlq"), ("POST", "/dlq/redrive"), ("POST", "/dlq/drop"),
    ]:
        answer = http.request(method, f"/v1/instances/inst_0000000000000000dead{suffix}")
        assert error_of(answer) == (404, "instance_not_found"), (method, suffix)
        assert error_of(http.request(method, f"/v1/instances/{'x' * 300}{suffix}")) == (404, "instance_not_found")
    # Another tenant's instance does not exist for this one.
    with actors_server.client() as default_tenant:
        assert error_of(default_tenant.get(f"/v1/instances/{inst['id']}")) == (404, "instance_not_found")

    unknown = http.post("/v1/instances", json={"actor": "nobody"})
    assert error_of(unknown) == (400, "unknown_actor")
    # The application derives this actor's filter from the config: one it cannot use is a 400.
    derived = tenant.create("worker", key="w", config={"role": "coder"})
    assert derived["filter"] == {"types": ["work.*"], "where": 'payload.role = "coder"'}
    no_role = http.post("/v1/instances", json={"actor": "worker", "key": "w2", "config": {}})
    assert error_of(no_role) == (400, "invalid_input")
    assert "KeyError" in no_role.json()["error"]["message"]

    expression = "payload.(("
    with pytest.raises(Exception) as parser:
        jsonata.Jsonata(expression)
    bad_filter = http.post("/v1/instances", json={"actor": "counter", "filter": {"where": expression}})
    assert error_of(bad_filter) == (400, "invalid_filter")
    assert str(parser.value) in bad_filter.json()["error"]["message"]
    for bad in ({"types": []}, {"types": ["count.*"], "streams": ["no-slash"]}, {"key": "payload.id"}, "types",
                {"where": 5}, {"where": ["payload"]}):
        answer = http.post("/v1/instances", json={"actor": "counter", "filter": bad})
        assert error_of(answer) == (400, "invalid_filter"), bad

    for body in [
        b"", b"{nope", b"[]", b'"counter"', b"{}", b'{"actor": 7}', b'{"actor": ""}', b'{"actor": "a\\u0000b"}',
        b'{"actor": "counter", "key": ""}', b'{"actor": "counter", "key": 5}', b'{"actor": "counter", "key": "a\\u0000"}',
        b'{"actor": "counter", "key": "' + b"k" * 501 + b'"}', b'{"actor": "counter", "config": [["a", 1]]}',
        b'{"actor": "counter", "config": "ab"}', b'{"actor": "counter", "config": {"a": "\\u0000"}}',
        b'{"actor": "counter", "filter": {"types": ["*"], "streams": ["/a\\u0000"]}}',
        b'{"actor": "counter", "surprise": 1}',
    ]:
        answer = http.post("/v1/instances", content=body, headers={"Content-Type": "application/json"})
        assert answer.status_code == 400 and answer.json()["error"]["code"] in ("invalid_input", "invalid_filter"), body

    iid = inst["id"]
    for body in [{"qids": "1"}, {"qids": 1}, {"qids": [True]}, {"qids": [0]}, {"qids": [2**63]}, {"qids": [1.5]},
                 {"other": 1}, [1]]:
        for action in ("redrive", "drop"):
            assert error_of(http.post(f"/v1/instances/{iid}/dlq/{action}", json=body)) == (400, "invalid_input"), body
    for url, params in [
        ("/v1/instances", {"limit": 0}), ("/v1/instances", {"limit": 1001}), ("/v1/instances", {"limit": "x"}),
        ("/v1/instances", {"actor": "a\x00"}), ("/v1/instances", {"after": "\x00"}),
        (f"/v1/instances/{iid}/queue", {"status": "bogus"}), (f"/v1/instances/{iid}/queue", {"limit": -1}),
        (f"/v1/instances/{iid}/dlq", {"limit": 0}),
    ]:
        assert error_of(http.get(url, params=params)) == (400, "invalid_input"), (url, params)
    assert error_of(http.get("/v1/instances/inst%00x")) == (400, "invalid_input")

    # Scopes: reading needs read; creating, redriving and dropping need admin.
    read_only = make_token(actors_server.db_url, tenant.name, "read,append")
    with actors_server.client(read_only) as c:
        assert c.get(f"/v1/instances/{iid}").status_code == 200
        assert c.get("/v1/instances").status_code == 200
        assert error_of(c.post("/v1/instances", json={"actor": "counter"})) == (403, "forbidden")
        assert error_of(c.post(f"/v1/instances/{iid}/dlq/redrive")) == (403, "forbidden")
        assert error_of(c.post(f"/v1/instances/{iid}/dlq/drop")) == (403, "forbidden")
    with actors_server.client("") as anonymous:
        assert error_of(anonymous.get("/v1/instances")) == (401, "unauthorized")
    assert error_of(http.get("/v1/instances", params={"tenant": "someone-else"})) == (403, "forbidden")


# --- the control plane / executor split ----------------------------------------------------


def start_worker(db_url: str, data_dir: Path) -> subprocess.Popen:
    env = {**os.environ, **FAST, "YOKE_DATABASE_URL": db_url, "YOKE_DATA_DIR": str(data_dir)}
    log = open(data_dir.parent / "worker.log", "w")
    return subprocess.Popen(
        [sys.executable, "-m", "yoke.cli", "worker", "--app", APP], env=env, stdout=log,
        stderr=subprocess.STDOUT, cwd=data_dir.parent,
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_no_executor_server_and_a_worker(kind, tmp_path):
    data_dir = tmp_path / ".yoke"
    with database(kind, tmp_path) as db_url:
        server = start_server(db_url, data_dir, args=("--app", APP, "--no-executor"), **FAST)
        t = Tenant(server)
        worker = None
        try:
            inst = t.create("counter", key="split")
            assert inst["filter"] == {"types": ["count.*"]} and inst["worker_id"] is None  # no executor here
            t.append("/split", *({"type": "count.x", "payload": n} for n in range(3)))
            portal = t.http.post("/v1/portals/hooks/split", json={"via": "portal"}, headers={"X-Signature": "ok"})
            assert portal.status_code == 202  # portals work without an executor
            assert len(t.http.get("/v1/streams/split/-/events").json()["events"]) == 3
            # Stored, not fanned out: every event is still behind the fan-out
            # cursors, nothing is queued, nothing ran.
            shown = t.show(inst["id"])
            assert shown["queue"] == {"pending": 0, "processing": 0, "dead": 0}
            assert shown["state"] == {"value": None, "version": 0}
            heads = sum(s["head"] for s in t.http.get("/v1/streams").json()["streams"])
            # Sampled from the database in the background: a pass after the last append shows it all.
            series = rf'^yoke_fanout_lag_events{{tenant="{t.name}"}} (\S+)$'

            def lag() -> float:
                found = re.search(series, t.http.get("/metrics").text, re.M)
                return float(found.group(1)) if found else 0

            assert wait_for(lambda: lag() == heads, "the fan-out lag to reach the heads") and heads >= 4

            worker = start_worker(db_url, data_dir)
            shown = wait_state(t, inst["id"], lambda s: s.get("n") == 4, "the worker to process the backlog")
            assert shown["worker_id"] is not None  # adopted by the worker
            # The API server reads the state the worker wrote (not a stale copy of its own).
            assert shown["state"]["version"] == 4

            # An append after the worker started reaches it too (NOTIFY on
            # PostgreSQL; fan-out's periodic sweep on SQLite).
            t.append("/split", {"type": "count.late", "payload": "late"})
            wait_state(t, inst["id"], lambda s: s.get("n") == 5, "the late append")
        finally:
            t.http.close()
            code = None
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
                try:
                    code = worker.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.wait()
            stop_server(server)
    assert code == 0  # the worker stopped gracefully
    log = (tmp_path / "worker.log").read_text()
    assert "yoke worker wrk_" in log and "yoke worker: stopped" in log


def test_api_only_server_without_an_app(tmp_path):
    """``yoke serve --no-executor`` with no app: no portals, any actor name
    (nothing to check it against), appends stored."""
    server = start_server(f"sqlite:///{tmp_path}/yoke.db", tmp_path / ".yoke", args=("--no-executor",), **FAST)
    try:
        with server.client() as http:
            for url in ("/v1/portals/hooks", "/v1/portals/hooks/x"):
                assert error_of(http.post(url, json={})) == (404, "portal_not_found")
            made = http.post("/v1/instances", json={"actor": "anything", "key": "k", "filter": {"types": ["a.*"]}})
            assert made.status_code == 201
            assert (made.json()["filter"], made.json()["worker_id"]) == ({"types": ["a.*"]}, None)
            assert http.post("/v1/streams/x/-/events", json={"type": "a.b"}).status_code == 201
            assert http.get(f"/v1/instances/{made.json()['id']}").json()["queue"]["pending"] == 0
    finally:
        stop_server(server)


def test_an_app_that_does_not_load_is_refused(tmp_path):
    env = {**os.environ, **FAST, "YOKE_DATA_DIR": str(tmp_path / ".yoke")}
    cases = [
        ("serve", "tests.http.no_such_module:app", "cannot load tests.http.no_such_module:app: ModuleNotFoundError"),
        ("worker", "tests.http.actor_app:counter", "tests.http.actor_app:counter is not a yoke.App"),
    ]

    def run(case: tuple[str, str, str]) -> tuple[str, subprocess.CompletedProcess]:
        command, spec, message = case
        out = subprocess.run(
            [sys.executable, "-m", "yoke.cli", command, "--app", spec, "--db", f"sqlite:///{tmp_path}/y.db"],
            env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )
        return message, out

    with ThreadPoolExecutor(len(cases)) as pool:
        for message, out in pool.map(run, cases):
            assert out.returncode == 1 and out.stderr.startswith("error: ") and message in out.stderr, out.stderr
