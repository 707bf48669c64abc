"""Subscriptions over HTTP and the CLI, against a real ``yoke serve`` per
backend: configure, copies arriving, idempotent reconfiguration, list and
show, cursor moves, a webhook that halts and is resumed, removal, every
error answer of the surface, and the ``yoke subscriptions`` commands.

The servers run with a fast retry ladder (a failing webhook halts within a
fraction of a second) on databases of their own: configured subscriptions
live in the database and would otherwise be delivered by every later
server or runtime on the shared test database. Progress is observed
through the wait route, never by sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from standardwebhooks import Webhook

import yoke

from .conftest import Server, own_database, start_server, stop_server

FAST = {
    "YOKE_SUBSCRIPTION_RETRY_BASE_S": "0.01",
    "YOKE_SUBSCRIPTION_RETRY_MAX_S": "0.02",
}
STATUS_FIELDS = {
    "name", "path", "config", "configured_at", "generation", "processed_through_offset", "head", "lag",
    "halted", "last_error", "last_error_at", "attempts", "next_retry_at", "delivered", "failures", "delivering",
    "parked", "state", "source_stream_id",
}


def database(kind: str, base: Path) -> contextlib.AbstractContextManager[str]:
    return own_database(kind, base, "yoke_http_subs")


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def subs_server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    base = tmp_path_factory.mktemp("subscriptions")
    with database(request.param, base) as db_url:
        srv = start_server(db_url, base / ".yoke", **FAST)
        try:
            yield srv
        finally:
            stop_server(srv)


@pytest.fixture
def http(subs_server: Server) -> Iterator[httpx.Client]:
    with subs_server.client() as client:
        yield client


def sub_url(path: str, action: str = "subscriptions") -> str:
    return f"/v1/streams{path}/-/{action}"


def error_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def append(http: httpx.Client, path: str, *events: dict[str, Any]) -> list[int]:
    response = http.post(f"/v1/streams{path}/-/events", json=list(events))
    assert response.status_code == 201, response.text
    return [r["offset"] for r in response.json()["results"]]


def wait(http: httpx.Client, path: str, name: str, offset: int | None = None, timeout_s: float = 20) -> dict[str, Any]:
    params: dict[str, Any] = {"name": name, "timeout_s": timeout_s}
    if offset is not None:
        params["offset"] = offset
    response = http.get(sub_url(path, "subscription/wait"), params=params, timeout=timeout_s + 10)
    assert response.status_code == 200, response.text
    return response.json()


def show(http: httpx.Client, path: str, name: str) -> dict[str, Any]:
    response = http.get(sub_url(path, "subscription"), params={"name": name})
    assert response.status_code == 200, response.text
    return response.json()


def events_of(http: httpx.Client, path: str) -> list[dict[str, Any]]:
    return http.get(f"/v1/streams{path}/-/events").json()["events"]


def data_types(events: list[dict[str, Any]]) -> list[str]:
    """The types of the events that are not Yoke's own (control events are in the log too)."""
    return [e["type"] for e in events if not e["type"].startswith("yoke.")]


def poll(check: Callable[[], Any], what: str, timeout_s: float = 20) -> Any:
    """``check()`` once it is truthy (a state no route waits for, e.g. a halt)."""
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return result


# --- a webhook receiver --------------------------------------------------------------


class Hook:
    """A local HTTP endpoint answering ``status``; remembers what it got."""

    def __init__(self) -> None:
        self.status = 500
        self.received: list[tuple[dict[str, str], bytes]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                hook.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(hook.status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    h = Hook()
    try:
        yield h
    finally:
        h.close()


# --- configure, deliver, reconfigure ------------------------------------------------------


def test_copy_subscription_delivers_and_identical_config_answers_200(http, path):
    target = path + "/copies"
    body = {"name": "audit/eu", "receiver": {"kind": "copy", "target": target}, "filter": {"types": ["order.*"]}}
    first = http.post(sub_url(path), json=body)
    assert first.status_code == 201, first.text
    made = first.json()
    assert made == {
        "name": "audit/eu", "path": path, "offset": 1, "id": made["id"], "created": True, "replaced": False,
        "secret": None,
    }
    again = http.post(sub_url(path), json=body)
    assert again.status_code == 200
    assert again.json() == {**made, "created": False}  # same configure event, nothing appended

    offsets = append(http, path, {"type": "order.placed", "payload": 1}, {"type": "note"}, {"type": "order.paid"})
    assert offsets == [2, 3, 4]
    status = wait(http, path, "audit/eu", 4)
    assert status["processed_through_offset"] >= 4 and status["delivered"] == 2 and status["lag"] == 0
    copies = events_of(http, target)
    assert [(e["type"], e["payload"]) for e in copies] == [("order.placed", 1), ("order.paid", {})]
    assert [e["source"]["copied_from"][-1]["offset"] for e in copies] == [2, 4]
    assert copies[0]["source"]["copied_from"][-1]["path"] == path

    # Another configuration under the same name replaces it (a new configure event).
    changed = http.post(sub_url(path), json={**body, "filter": {"types": ["order.*"], "where": "payload = 1"}})
    assert changed.status_code == 201
    assert changed.json()["offset"] == 5 and changed.json()["created"] is True and changed.json()["replaced"] is True
    assert show(http, path, "audit/eu")["config"]["filter"] == {"types": ["order.*"], "where": "payload = 1"}


def test_list_show_cursor_and_remove(http, path):
    target = path + "/all"
    named = http.post(sub_url(path), json={"name": "a", "receiver": {"kind": "copy", "target": target},
                                           "start": "beginning"})
    assert named.status_code == 201
    generated = http.post(sub_url(path), json={"receiver": {"kind": "copy", "target": path + "/other"},
                                               "transform": '{"type": "seen", "payload": offset}'})
    assert generated.status_code == 201
    other = generated.json()["name"]
    assert other == f"subscription:{generated.json()['offset']}"
    append(http, path, {"type": "x"}, {"type": "y"})  # offsets 3, 4
    wait(http, path, "a", 4)
    wait(http, path, other)  # default offset: the head

    listed = http.get(sub_url(path)).json()["subscriptions"]
    assert [s["name"] for s in listed] == ["a", other]
    a = show(http, path, "a")
    assert set(a) == STATUS_FIELDS and listed[0] == a
    assert a["config"] == {
        "kind": "copy", "target": target, "filter": None, "transform": None, "start": "beginning",
        "on_failing_event": "halt",
    }
    assert (a["path"], a["configured_at"], a["generation"], a["head"], a["lag"]) == (path, 1, 1, 4, 0)
    assert (a["halted"], a["last_error"], a["attempts"], a["next_retry_at"], a["failures"]) == (None, None, 0, None, 0)
    assert (a["state"], a["parked"]) == ("running", None)
    assert a["source_stream_id"] == http.get(f"/v1/streams{path}").json()["stream_id"]
    assert data_types(events_of(http, target)) == ["x", "y"]
    assert [e["payload"] for e in events_of(http, path + "/other")] == [3, 4]  # transformed

    # Move the cursor back: a new run copies again.
    moved = http.post(sub_url(path, "subscription/cursor"), params={"name": "a"}, json={"after_offset": 2})
    assert moved.status_code == 200
    assert (moved.json()["processed_through_offset"], moved.json()["generation"]) == (2, 5)
    wait(http, path, "a", 5)
    assert data_types(events_of(http, target)) == ["x", "y", "x", "y"]
    resumed = http.post(sub_url(path, "subscription/resume"), params={"name": "a"})  # not halted: unchanged
    assert resumed.status_code == 200 and resumed.json()["halted"] is None

    removed = http.delete(sub_url(path, "subscription"), params={"name": "a"})
    assert removed.status_code == 204 and removed.content == b""
    assert error_of(http.get(sub_url(path, "subscription"), params={"name": "a"})) == (404, "subscription_not_found")
    assert [s["name"] for s in http.get(sub_url(path)).json()["subscriptions"]] == [other]
    assert events_of(http, path)[-1]["type"] == "yoke.subscription.removed"
    assert http.get(sub_url("/never/used")).json() == {"subscriptions": []}


def test_root_stream_subscriptions(http):
    name = "root-" + uuid.uuid4().hex[:8]
    made = http.post("/v1/streams/-/subscriptions", json={"name": name, "receiver": {"kind": "copy",
                                                                                   "target": "/from-root"}})
    assert made.status_code == 201 and made.json()["path"] == "/"
    assert show(http, "", name)["path"] == "/"
    assert http.delete("/v1/streams/-/subscription", params={"name": name}).status_code == 204


def test_webhook_halts_and_resumes(http, path, hook):
    made = http.post(sub_url(path), json={"name": "hook", "receiver": {"kind": "webhook", "url": hook.url}})
    assert made.status_code == 201
    secret = made.json()["secret"]
    assert secret.startswith("whsec_")  # generated, shown once
    config = show(http, path, "hook")["config"]
    assert config["url"] == hook.url and config["secret_id"].startswith("sha256:") and "secret" not in config
    [offset] = append(http, path, {"type": "ping", "payload": {"n": 1}})

    halted = poll(lambda: (s := show(http, path, "hook"))["halted"] and s, "the webhook to halt")
    assert halted["halted"]["offset"] == offset and halted["halted"]["attempts"] == 15
    assert "answered 500" in halted["last_error"] and halted["failures"] == 15
    assert halted["processed_through_offset"] == offset - 1 and halted["next_retry_at"] is None
    timed_out = http.get(sub_url(path, "subscription/wait"), params={"name": "hook", "offset": offset,
                                                                      "timeout_s": 0.1})
    assert error_of(timed_out) == (504, "not_processed")
    assert timed_out.json()["error"]["processed_through_offset"] == offset - 1

    hook.status = 204
    resumed = http.post(sub_url(path, "subscription/resume"), params={"name": "hook"})
    assert resumed.status_code == 200 and resumed.json()["halted"] is None
    status = wait(http, path, "hook", offset)
    assert status["delivered"] >= 1 and status["attempts"] == 0
    assert len(hook.received) >= 16  # 15 refused attempts, then the one that succeeded
    headers, body = hook.received[15]
    Webhook(secret).verify(body, headers)  # the Standard Webhooks reference verifier
    sent = orjson.loads(body)
    assert (sent["path"], sent["name"], sent["event"]["offset"], sent["event"]["payload"]) == (
        path, "hook", offset, {"n": 1}
    )
    assert headers["webhook-id"] == hook.received[0][0]["webhook-id"]  # the same message, retried
    assert [e["type"] for e in events_of(http, path)][-2:] == [
        "yoke.subscription.halted", "yoke.subscription.resumed"
    ]


# --- errors ----------------------------------------------------------------------------------


def test_error_answers(http, path, subs_server):
    copy = {"kind": "copy", "target": path + "/c"}
    assert http.post(sub_url(path), json={"name": "s", "receiver": copy}).status_code == 201
    item = sub_url(path, "subscription")

    # 404: no such name (on this stream, or on a stream that does not exist).
    for method, action, body in [
        ("GET", "subscription", None), ("DELETE", "subscription", None), ("POST", "subscription/resume", None),
        ("POST", "subscription/cursor", {"after_offset": 0}), ("GET", "subscription/wait", None),
    ]:
        for on in (path, "/no/such/stream"):
            answer = http.request(method, sub_url(on, action), params={"name": "missing/one"}, json=body)
            assert error_of(answer) == (404, "subscription_not_found"), (method, action, on)
    assert http.get("/v1/streams/no/such/stream").status_code == 404  # nothing was created

    def subscribe(**body: Any) -> tuple[int, str]:
        return error_of(http.post(sub_url(path), json={"name": "x", "receiver": copy, **body}))

    assert subscribe(transform="payload.((") == (400, "invalid_transform")
    assert subscribe(transform=5) == (400, "invalid_transform")
    assert subscribe(receiver={"kind": "copy", "target": path}) == (400, "invalid_subscription")  # itself
    assert subscribe(on_failing_event="skip") == (400, "invalid_subscription")  # a copy cannot skip
    assert subscribe(receiver={"kind": "processor", "processor": "p"}, transform="$") == (400, "invalid_subscription")
    assert subscribe(filter={"where": "payload.(("}) == (400, "invalid_filter")
    assert subscribe(filter={"where": 5}) == (400, "invalid_filter")
    assert subscribe(filter={"types": []}) == (400, "invalid_filter")
    assert subscribe(filter={"types": ["*"], "streams": ["/a"]}) == (400, "invalid_filter")
    assert subscribe(filter={"other": 1}) == (400, "invalid_filter")
    assert subscribe(receiver={"kind": "copy", "target": "no-slash"}) == (400, "invalid_path")
    for receiver in [
        {"kind": "webhook", "url": "ftp://example.com/hook"}, {"kind": "webhook", "url": "http://[::1"},
        {"kind": "webhook", "url": "http://h/\x00"}, {"kind": "webhook", "url": "http://h", "secret": "nope"},
        {"kind": "webhook"}, {"kind": "mail", "to": "x"}, {"kind": "copy", "target": "/b", "extra": 1},
        {"kind": "call", "function": ""}, "copy", None,
    ]:
        assert subscribe(receiver=receiver) == (400, "invalid_input"), receiver
    for body in [{"start": "later"}, {"on_failing_event": "retry"}, {"name": ""}, {"name": "n" * 501},
                 {"name": "subscription:7"}, {"name": 5}, {"surprise": 1}]:
        assert subscribe(**body) == (400, "invalid_input"), body
    for raw in [b"", b"{nope", b"[]"]:
        answer = http.post(sub_url(path), content=raw, headers={"Content-Type": "application/json"})
        assert error_of(answer) == (400, "invalid_input"), raw
    assert error_of(http.post("/v1/streams/a%20b/-/subscriptions", json={"receiver": copy})) == (400, "invalid_path")

    head = http.get(f"/v1/streams{path}").json()["head"]
    cursor = sub_url(path, "subscription/cursor")
    answer = http.post(cursor, params={"name": "s"}, json={"after_offset": head + 1})
    assert error_of(answer) == (400, "invalid_cursor")
    for body in [{}, {"after_offset": -1}, {"after_offset": "1"}, {"after_offset": 0, "resume": "yes"},
                 {"after_offset": 0, "other": 1}]:
        assert error_of(http.post(cursor, params={"name": "s"}, json=body)) == (400, "invalid_input"), body
    for params in [{}, {"name": ""}, {"name": "n" * 501}, {"name": "a\x00"}]:
        assert error_of(http.get(item, params=params)) == (400, "invalid_input"), params
    wait_url = sub_url(path, "subscription/wait")
    for params in [{"timeout_s": 61}, {"timeout_s": -1}, {"timeout_s": "nan"}, {"offset": -1}, {"offset": "x"}]:
        assert error_of(http.get(wait_url, params={"name": "s", **params})) == (400, "invalid_input"), params
    answer = http.get(wait_url, params={"name": "s", "offset": head + 100, "timeout_s": 0.05})
    assert error_of(answer) == (504, "not_processed")
    assert answer.json()["error"]["offset"] == head + 100

    # A change of configuration appends to the source: refused on a full or closed stream.
    full = path + "/full"
    assert http.put(f"/v1/streams{full}", json={"limits": {"max_total_events": 1}}).status_code == 201
    append(http, full, {"type": "e"})
    assert error_of(http.post(sub_url(full), json={"receiver": copy})) == (507, "quota_exhausted")
    unread = path + "/unread"
    assert http.put(f"/v1/streams{unread}", json={"limits": {"max_unread_events": 1}}).status_code == 201
    assert http.post(f"/v1/streams{unread}/-/consumers/r/ack", json={"offset": 0}).status_code == 200
    append(http, unread, {"type": "e"})
    answer = http.post(sub_url(unread), json={"receiver": copy})
    assert error_of(answer) == (429, "backpressure") and "Retry-After" in answer.headers
    assert http.post(f"/v1/streams{path}/-/close").status_code == 200
    assert error_of(http.post(sub_url(path), json={"name": "late", "receiver": copy})) == (409, "stream_closed")

    # Scopes: reading and waiting need read; everything that changes a subscription needs admin.
    read_only = subs_server.new_token("default", "read,append")
    with subs_server.client(read_only) as c:
        assert c.get(sub_url(path)).status_code == 200
        assert c.get(item, params={"name": "s"}).status_code == 200
        assert c.get(wait_url, params={"name": "s", "offset": 0}).status_code == 200
        for method, action, body in [
            ("POST", "subscriptions", {"receiver": copy}), ("DELETE", "subscription", None),
            ("POST", "subscription/resume", None), ("POST", "subscription/cursor", {"after_offset": 0}),
        ]:
            answer = c.request(method, sub_url(path, action), params={"name": "s"}, json=body)
            assert error_of(answer) == (403, "forbidden"), (method, action)
    with subs_server.client("") as anonymous:
        assert error_of(anonymous.get(sub_url(path))) == (401, "unauthorized")
    assert error_of(http.get(item, params={"name": "s", "tenant": "someone-else"})) == (403, "forbidden")


async def test_wait_answers_503_when_the_server_stops(tmp_path, monkeypatch):
    """A waiting request ends at once with 503 when the server begins to
    stop, so it never holds the graceful shutdown (in process: the wait's
    start is observable there)."""
    from yoke.http.app import create_app, serve_runtime
    from yoke.streams.stream import Stream

    entered = asyncio.Event()
    original = Stream.wait_until_processed

    async def observed(self: Stream, *args: Any, **kwargs: Any) -> Any:
        entered.set()
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(Stream, "wait_until_processed", observed)
    app = create_app(contextlib.nullcontext)  # the lifespan is not run: the runtime is set below
    async with yoke.open(f"sqlite:///{tmp_path}/yoke.db") as runtime:
        serve_runtime(app, runtime)
        token = (await runtime.tokens.create("default", ["admin"], "test")).token
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(transport=transport, base_url="http://yoke", headers=headers) as c:
            made = await c.post(sub_url("/s"), json={"name": "w", "receiver": {"kind": "copy", "target": "/t"}})
            assert made.status_code == 201
            params = {"name": "w", "offset": 10**6, "timeout_s": 60}
            pending = asyncio.ensure_future(c.get(sub_url("/s", "subscription/wait"), params=params))
            async with asyncio.timeout(10):
                await entered.wait()
            app.state.shutdown.set()
            async with asyncio.timeout(10):
                answer = await pending
    assert error_of(answer) == (503, "runtime_closed")


# --- the CLI ------------------------------------------------------------------------------------


def test_cli_subscriptions(subs_server, http, path, hook):
    def cli(*args: str, check: bool = True) -> Any:
        return subs_server.cli("subscriptions", *args, "--url", subs_server.url, check=check)

    def cli_many(*commands: tuple[str, ...]) -> list[Any]:
        with ThreadPoolExecutor(len(commands)) as pool:
            return list(pool.map(lambda args: cli(*args, check=False), commands))

    hook.status = 204
    target = path + "/cli"
    add = ("add", path, "--name", "c/1", "--copy-to", target, "--types", "order.*", "--where", "payload.n > 0")
    made = orjson.loads(cli(*add, "--json").stdout)
    assert (made["name"], made["created"], made["offset"]) == ("c/1", True, 1)
    again, hooked, two_receivers = cli_many(
        add, ("add", path, "--name", "h", "--webhook", hook.url, "--on-failing-event", "skip"),
        ("add", path, "--copy-to", target, "--call", "f"),
    )
    assert again.stdout.strip() == f"exists  c/1 on {path} (configured at offset 1)"
    assert "created h on" in hooked.stdout and "webhook secret (shown once): whsec_" in hooked.stdout
    assert two_receivers.returncode == 1
    assert two_receivers.stderr == (
        "error: give exactly one receiver: --copy-to PATH, --call NAME, --processor NAME or --webhook URL\n"
    )

    append(http, path, {"type": "order.placed", "payload": {"n": 1}}, {"type": "order.placed", "payload": {"n": 0}})
    waited = orjson.loads(cli("wait", path, "c/1", "--json").stdout)  # through the head
    assert waited["processed_through_offset"] >= 4 and waited["delivered"] == 1
    listed, shown, moved, resumed, missing, timed_out = cli_many(
        ("list", path), ("show", path, "c/1"), ("cursor", path, "c/1", "0", "--resume", "--json"),
        ("resume", path, "h"), ("show", path, "nope"), ("wait", path, "c/1", "999", "--timeout", "0.1"),
    )
    assert "c/1" in listed.stdout and f"copy to {target}" in listed.stdout and f"webhook {hook.url}" in listed.stdout
    assert f"receiver    copy to {target}" in shown.stdout
    assert 'filter      {"types":["order.*"],"where":"payload.n > 0"}' in shown.stdout
    assert orjson.loads(moved.stdout)["processed_through_offset"] == 0
    assert resumed.stdout.startswith("h: running, processed through ")
    paused, = cli_many(("pause", path, "h"))
    assert paused.stdout.startswith("h: parked at ")
    halted, = cli_many(("halt", path, "h"))
    assert halted.stdout.startswith("h: halted at ")
    assert cli("resume", path, "h").stdout.startswith("h: running, processed through ")
    assert missing.returncode == 1
    assert missing.stderr == f"error: subscription_not_found (404): no subscription 'nope' on {path}\n"
    assert timed_out.returncode == 1 and timed_out.stderr.startswith("error: not_processed (504): ")

    wait(http, path, "c/1")  # the copies of the new run
    assert [e["payload"] for e in events_of(http, target)] == [{"n": 1}, {"n": 1}]
    assert cli("remove", path, "c/1").stdout.strip() == f"removed c/1 from {path}"
    assert [s["name"] for s in http.get(sub_url(path)).json()["subscriptions"]] == ["h"]


def test_pause_halt_and_resume_over_http(http, path):
    target = path + "/paused"
    assert http.post(sub_url(path), json={"name": "p", "receiver": {"kind": "copy", "target": target},
                                          "start": "beginning"}).status_code == 201
    append(http, path, {"type": "a"})
    wait(http, path, "p")
    r = http.post(sub_url(path, "subscription/pause"), params={"name": "p"})
    assert r.status_code == 200
    paused = r.json()
    assert paused["state"] == "parked" and paused["halted"] is None and paused["parked"]["reason"] == "operator"
    append(http, path, {"type": "b"})
    shown = http.get(sub_url(path, "subscription"), params={"name": "p"}).json()
    assert shown["state"] == "parked" and shown["processed_through_offset"] == paused["processed_through_offset"]
    halted = http.post(sub_url(path, "subscription/halt"), params={"name": "p"}).json()
    assert halted["state"] == "halted" and halted["halted"]["reason"] == "operator"
    assert error_of(http.post(sub_url(path, "subscription/halt"), params={"name": "nope"})) == (
        404, "subscription_not_found")
    assert http.post(sub_url(path, "subscription/resume"), params={"name": "p"}).json()["state"] == "running"
    wait(http, path, "p")
    assert [e["type"] for e in events_of(http, target) if not e["type"].startswith("yoke.")] == ["a", "b"]
    kinds = [e["type"] for e in events_of(http, path) if e["type"].startswith("yoke.subscription.")]
    assert kinds == ["yoke.subscription.configured", "yoke.subscription.paused", "yoke.subscription.halted",
                     "yoke.subscription.resumed"]
