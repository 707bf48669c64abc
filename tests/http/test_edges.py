"""The edges of the HTTP API, on both backends: NUL characters, error shapes
and codes, Content-Type, missing streams, PUT definitions, tails of closed
streams (see docs/reference/http.md)."""

from __future__ import annotations

import time

import orjson
import pytest
from httpx_sse import connect_sse

from .conftest import events_url


def error_of(response) -> tuple[int, str]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert response.headers["content-type"] == "application/json"
    return response.status_code, body["error"]["code"]


# --- NUL characters ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "field"),
    [
        ("GET", "/v1/streams?prefix=/a%00", "prefix"),
        ("GET", "/v1/streams?after=/a%00", "after"),
        ("GET", "/v1/streams?tenant=a%00", "tenant"),
        ("GET", "/v1/streams?limit=1&a%00=1", "a\\0"),
        ("GET", "/v1/streams/a%00b", "path"),
        ("PUT", "/v1/streams/a%00b", "path"),
        ("GET", "/v1/streams/a%00b/-/events", "path"),
        ("POST", "/v1/streams/a%00b/-/events", "path"),
        ("GET", "/v1/streams/nul/-/events?after=%00", "after"),
        ("GET", "/v1/streams/nul/-/tail?types=a%00", "types"),
        ("GET", "/v1/streams/nul/-/tail?where=%00", "where"),
        ("GET", "/v1/streams/nul/-/consumers?tenant=%00", "tenant"),
        ("POST", "/v1/streams/nul/-/consumers/c%00/ack", "path"),
        ("DELETE", "/v1/streams/nul/-/consumers/c%00", "path"),
        ("GET", "/v1/streams/nul/-/subscription?name=s%00", "name"),
        ("DELETE", "/v1/streams/nul/-/subscription?name=s%00", "name"),
        ("GET", "/v1/streams/nul/-/objects/o%00", "path"),
        ("DELETE", "/v1/tokens/t%00", "path"),
        ("GET", "/v1/instances?actor=a%00", "actor"),
        ("GET", "/v1/instances?after=%00", "after"),
        ("GET", "/v1/instances/i%00", "path"),
        ("GET", "/v1/instances/i/queue?status=%00", "status"),
        ("GET", "/api/workflow-streams/runs/r%00/streams/s", "path"),
        ("GET", "/api/workflow-streams/runs/r/streams/s/records?after=0%00", "after"),
        ("POST", "/api/workflow-streams/runs/r/streams/s/consumers/c%00/ack", "path"),
        ("GET", "/v1/portals/p%00", "path"),
    ],
)
def test_a_nul_anywhere_in_the_url_is_invalid_input(http, method, url, field):
    r = http.request(method, url, json={"type": "x", "offset": 0} if method in ("POST", "PUT") else None)
    assert error_of(r) == (400, "invalid_input")
    assert r.json()["error"]["field"] == field


# --- missing streams --------------------------------------------------------------


def test_reading_a_stream_never_created_is_404_like_its_info(http, path):
    assert error_of(http.get(f"/v1/streams{path}")) == (404, "stream_not_found")
    assert error_of(http.get(events_url(path))) == (404, "stream_not_found")
    assert error_of(http.get(events_url(path), params={"after": 3})) == (404, "stream_not_found")
    assert error_of(http.get(f"{events_url(path)}/1")) == (404, "stream_not_found")
    run = "/api/workflow-streams/runs/r" + path.rsplit("/", 1)[1] + "/streams/missing"
    assert error_of(http.get(run)) == (404, "stream_not_found")
    assert error_of(http.get(f"{run}/records")) == (404, "stream_not_found")
    # Once created (here by its first append), the same reads answer.
    http.post(events_url(path), json={"type": "x"})
    assert [e["offset"] for e in http.get(events_url(path)).json()["events"]] == [1]
    assert error_of(http.get(f"{events_url(path)}/2")) == (404, "event_not_found")


def test_a_tail_of_a_stream_never_created_waits_for_it(server, http, path):
    # A tail may start before the producer's first append (and a browser's
    # EventSource gives up for good on a 404), so it waits instead.
    with server.client() as c, connect_sse(c, "GET", events_url(path, "tail")) as source:
        assert source.response.status_code == 200
        http.post(events_url(path), json={"type": "born"})
        first = next(sse for sse in source.iter_sse() if sse.data)
        assert orjson.loads(first.data)["type"] == "born"


# --- tails of closed streams ------------------------------------------------------


def until_the_end(frames, within_s: float = 20) -> list:
    """The rest of a tail's SSE events (heartbeats left out), which must end
    by itself: the server's heartbeats keep the loop turning to notice."""
    deadline = time.monotonic() + within_s
    rest = []
    for sse in frames:
        if sse.data or sse.event != "message":
            rest.append(sse)
        if time.monotonic() > deadline:
            pytest.fail(f"the tail did not end within {within_s} s")
    return rest


def sse_frames(client, url: str, **kwargs) -> list:
    """Every SSE event of a tail that must end by itself."""
    with connect_sse(client, "GET", url, **kwargs) as source:
        assert source.response.status_code == 200
        return until_the_end(source.iter_sse())


def test_a_tail_of_a_closed_stream_sends_everything_then_a_closed_event_and_ends(server, http, path):
    http.post(events_url(path), json=[{"type": "x", "payload": i} for i in range(3)])
    http.post(f"/v1/streams{path}/-/close")
    with server.client() as c:
        frames = sse_frames(c, events_url(path, "tail"))
        assert [(f.event, f.id) for f in frames] == [("message", "1"), ("message", "2"), ("message", "3"), ("closed", "3")]
        assert orjson.loads(frames[-1].data) == {"path": path, "closed": True}
        resumed = sse_frames(c, events_url(path, "tail"), headers={"Last-Event-ID": "2"})
        assert [(f.event, f.id) for f in resumed] == [("message", "3"), ("closed", "3")]
        at_head = sse_frames(c, events_url(path, "tail"), params={"after": 3})
        assert [f.event for f in at_head] == ["closed"]
        filtered = sse_frames(c, events_url(path, "tail"), params={"where": "payload = 1"})
        assert [(f.event, f.id) for f in filtered] == [("message", "2"), ("closed", "2")]


def test_closing_a_stream_ends_its_live_sse_tails(server, http, path):
    http.post(events_url(path), json={"type": "x"})
    run = "r" + path.rsplit("/", 1)[1]
    base = f"/api/workflow-streams/runs/{run}/streams"
    assert http.post(base, json={"stream_id": "out"}).status_code == 201
    http.post(f"{base}/out/records", json={"type": "x"})
    with server.client() as c, server.client() as w:
        with connect_sse(c, "GET", events_url(path, "tail")) as v1, connect_sse(w, "GET", f"{base}/out/subscribe") as wf:
            for source, close in ((v1, f"/v1/streams{path}/-/close"), (wf, f"{base}/out/close")):
                frames = source.iter_sse()
                assert next(f for f in frames if f.data).id == "1"
                http.post(events_url(path) if source is v1 else f"{base}/out/records", json={"type": "y"})
                assert next(f for f in frames if f.data).id == "2"
                assert http.post(close).status_code == 200
                rest = until_the_end(frames)  # ends: the server finishes the response
                assert [(f.event, orjson.loads(f.data).get("closed")) for f in rest] == [("closed", True)]


def test_cli_tail_ends_when_the_stream_is_closed(server, http, path):
    http.post(events_url(path), json=[{"type": "a"}, {"type": "b"}])
    http.post(f"/v1/streams{path}/-/close")
    out = server.cli("tail", path, "--json", "--url", server.url)
    assert [orjson.loads(line)["type"] for line in out.stdout.splitlines()] == ["a", "b"]


# --- PUT: one rule for definitions ------------------------------------------------


def test_put_creates_then_accepts_the_same_definition_and_refuses_another(http, path):
    definition = {"retention": {"max_age_s": 60, "max_events": 10}, "limits": {"max_unread_events": 5},
                  "metadata": {"kind": "a", "n": 1}}
    assert http.put(f"/v1/streams{path}", json=definition).status_code == 201
    assert http.put(f"/v1/streams{path}", json=definition).status_code == 200
    spelled_out = {**definition, "retention": {"max_age_s": 60.0, "max_events": 10},
                   "limits": {"max_unread_events": 5, "overflow": "reject", "block_timeout_s": 5},
                   "metadata": {"n": 1, "kind": "a"}}
    assert http.put(f"/v1/streams{path}", json=spelled_out).status_code == 200  # the same, spelled out
    for changed in (
        {**definition, "retention": {"max_age_s": 60, "max_events": 11}},
        {**definition, "limits": {}},
        {**definition, "metadata": {"kind": "a", "n": True}},
        {"retention": definition["retention"], "limits": definition["limits"]},
        {},
    ):
        r = http.put(f"/v1/streams{path}", json=changed)
        assert error_of(r) == (409, "stream_exists"), changed
        assert r.json()["error"]["existing"]["metadata"] == {"kind": "a", "n": 1}
    info = http.get(f"/v1/streams{path}").json()
    assert (info["retention"]["max_events"], info["metadata"]) == (10, {"kind": "a", "n": 1})  # unchanged
    # Settings change through their own routes.
    assert http.put(f"/v1/streams{path}/-/retention", json={"max_age_s": 60, "max_events": 11}).status_code == 200
    assert http.put(f"/v1/streams{path}", json={**definition, "retention": {"max_age_s": 60, "max_events": 11}}).status_code == 200


def test_put_on_a_stream_created_by_its_first_append(http, path):
    http.post(events_url(path), json={"type": "x"})
    assert http.put(f"/v1/streams{path}").status_code == 200  # no body: the defaults it has
    assert http.put(f"/v1/streams{path}", json={}).status_code == 200
    assert error_of(http.put(f"/v1/streams{path}", json={"retention": {"max_events": 5}})) == (409, "stream_exists")


def test_the_workflow_surface_follows_the_same_rule(http, path):
    run = "r" + path.rsplit("/", 1)[1]
    base = f"/api/workflow-streams/runs/{run}/streams"
    definition = {"stream_id": "s", "retention": {"max_events": 10}, "metadata": {"k": 1}}
    assert http.post(base, json=definition).status_code == 201
    assert http.post(base, json=definition).status_code == 200
    assert error_of(http.post(base, json={**definition, "metadata": {"k": 2}})) == (409, "stream_exists")
    # The generic PUT of the same definition matches it (pinned is not part of
    # what PUT defines); a different one is refused the same way.
    same = {"retention": {"max_events": 10}, "metadata": {"k": 1}}
    assert http.put(f"/v1/streams/runs/{run}/s", json=same).status_code == 200
    assert error_of(http.put(f"/v1/streams/runs/{run}/s", json={})) == (409, "stream_exists")
    # A workflow definition is pinned: an existing stream that is not is another definition.
    http.post(f"/v1/streams/runs/{run}/plain/-/events", json={"type": "x"})
    assert error_of(http.post(base, json={"stream_id": "plain"})) == (409, "stream_exists")


# --- one error shape and code per kind of mistake ---------------------------------


@pytest.mark.parametrize(
    ("value", "status", "code"),
    [("abc", 400, "invalid_input"), ("-1", 400, "invalid_input"), ("+1", 400, "invalid_input"),
     ("1.0", 400, "invalid_input"), ("١", 400, "invalid_input"), (str(2**63), 400, "invalid_input"),
     ("9" * 4301, 400, "invalid_input"),  # past int()'s digit limit: was a 500
     ("99", 400, "invalid_cursor")],
)
def test_a_last_event_id_that_is_not_an_offset_is_invalid_input_like_after(http, path, value, status, code):
    http.post(events_url(path), json={"type": "x"})
    r = http.get(events_url(path, "tail"), headers={"Last-Event-ID": value.encode()})
    assert error_of(r) == (status, code)
    # The same kinds of mistake in ?after= get the same codes.
    after = "-1" if code == "invalid_input" else value
    assert error_of(http.get(events_url(path, "tail"), params={"after": after})) == (status, code)


@pytest.mark.parametrize(
    "content_type", ["application/x-www-form-urlencoded", "text/plain", "application/jsonx", "multipart/form-data"]
)
def test_a_json_route_refuses_another_content_type_with_415(http, path, content_type):
    body = b'{"type": "x"}'
    for method, url in (
        ("POST", events_url(path)),  # the hot path
        ("PUT", f"/v1/streams{path}"),
        ("PUT", f"/v1/streams{path}/-/retention"),
        ("POST", "/v1/tokens"),
        ("POST", f"/v1/streams{path}/-/subscriptions"),
        ("POST", "/api/workflow-streams/runs/r/streams/s/records"),
    ):
        r = http.request(method, url, content=body, headers={"Content-Type": content_type})
        assert error_of(r) == (415, "unsupported_media_type"), url
        assert r.json()["error"]["expected"] == "application/json"
    assert error_of(http.get(f"/v1/streams{path}")) == (404, "stream_not_found")  # nothing was created


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "application/json; charset=utf-8", "Application/JSON;charset=UTF-8"]
)
def test_a_json_route_takes_json_declared_or_not(http, path, content_type):
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = http.post(events_url(path), content=b'{"type": "x"}', headers=headers)
    assert r.status_code == 201
    r = http.put(f"/v1/streams{path}/-/retention", content=b'{"max_events": 5}', headers=headers)
    assert r.status_code == 200
    # A body-less request is not checked (curl -X POST sends no type).
    assert http.post(f"/v1/streams{path}/-/close", headers={"Content-Type": "text/plain"}).status_code == 200


def test_the_banner_curl_lines_work_as_printed(server, http):
    """The curl lines `yoke serve` prints to try, run by a shell with real
    curl: the append sends JSON (curl -d alone would be form data, 415),
    the read returns it, the tail follows it and ends once the stream closes."""
    import shutil
    import subprocess
    from urllib.parse import urlsplit

    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    port = urlsplit(server.url).port
    banner = (server.data_dir.parent / f"server-{port}.log").read_text()
    lines = [line.strip() for line in banner.splitlines() if line.strip().startswith("curl ")]
    assert len(lines) == 3, banner

    def shell(line: str) -> str:
        done = subprocess.run(
            ["bash", "-c", line], capture_output=True, text=True, timeout=30, cwd=server.data_dir.parent
        )
        assert done.returncode == 0, (line, done.stderr)
        return done.stdout

    appended = orjson.loads(shell(lines[0]))
    page = orjson.loads(shell(lines[1]))
    assert page["events"][-1]["offset"] == appended["offset"]
    assert page["events"][-1]["type"] == "hello"
    assert http.post("/v1/streams/demo/-/close").status_code == 200
    tail = shell(lines[2])  # ends by itself: the stream is closed
    assert '"type":"hello"' in tail and "event: closed" in tail


def test_an_unexpected_server_failure_is_json_too(tmp_path):
    # A request reaching a route before the runtime is attached fails in an
    # unplanned way: the answer is still the JSON error shape.
    import asyncio
    import contextlib

    import httpx

    from yoke.http.app import create_app

    async def run() -> httpx.Response:
        app = create_app(contextlib.nullcontext)  # no lifespan: no runtime
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://yoke") as c:
            return await c.get("/v1/streams", headers={"Authorization": "Bearer yk_tok_x"})

    r = asyncio.run(run())
    assert error_of(r) == (500, "internal_error")


# --- a forgotten '-' segment ----------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "url", "meant"),
    [
        ("POST", "/v1/streams/a/events", "/v1/streams/a/-/events"),
        ("POST", "/v1/streams/events", "/v1/streams/-/events"),  # the root stream
        ("POST", "/v1/streams/a/b/consumers/c1/ack", "/v1/streams/a/b/-/consumers/c1/ack"),
        ("POST", "/v1/streams/a/close", "/v1/streams/a/-/close"),
        ("POST", "/v1/streams/a/objects", "/v1/streams/a/-/objects"),
        ("POST", "/v1/streams/a/subscription/resume?name=s", "/v1/streams/a/-/subscription/resume"),
    ],
)
def test_a_405_for_a_forgotten_separator_names_the_route_meant(http, method, url, meant):
    r = http.request(method, url)
    assert error_of(r) == (405, "method_not_allowed")
    error = r.json()["error"]
    assert error["hint"] == f"{method} {meant}"
    assert f"did you mean {method} {meant}?" in error["message"]
    assert error["allowed"] == ["GET", "PUT", "DELETE"]  # the stream's own URL: info, create, delete
    assert r.headers["allow"] == "GET, PUT, DELETE"


def test_deleting_a_missing_stream_named_like_an_action_hints_at_the_action(http, path):
    # DELETE is the stream's own method: a stream /a/consumers/c1 would be
    # deleted; none exists, and the 404 names the route probably meant.
    r = http.delete(f"/v1/streams{path}/consumers/c1")
    assert error_of(r) == (404, "stream_not_found")
    assert r.json()["error"]["hint"] == f"DELETE /v1/streams{path}/-/consumers/c1"


def test_the_hinted_route_is_the_right_one(http, path):
    body = {"type": "order.placed"}
    hint = http.post(f"/v1/streams{path}/events", json=body).json()["error"]["hint"]
    method, url = hint.split(" ", 1)
    assert (method, url) == ("POST", events_url(path))
    assert http.request(method, url, json=body).status_code == 201


def test_a_405_without_a_probable_route_says_what_the_url_takes(http):
    r = http.delete("/healthz")
    assert error_of(r) == (405, "method_not_allowed")
    assert "hint" not in r.json()["error"]
    assert r.json()["error"]["allowed"] == ["GET"]
    assert r.headers["allow"] == "GET"
    r = http.post("/v1/streams/a/-/eventz")  # has its '-': another mistake, no guess
    assert error_of(r) == (405, "method_not_allowed")
    assert "hint" not in r.json()["error"]


def test_the_info_of_a_missing_stream_named_like_an_action_hints_at_the_action(http, path):
    r = http.get(f"/v1/streams{path}/events")
    assert error_of(r) == (404, "stream_not_found")
    assert r.json()["error"]["hint"] == f"GET {events_url(path)}"
    r = http.get(f"/v1/streams{path}")  # no action in sight: no hint
    assert error_of(r) == (404, "stream_not_found")
    assert "hint" not in r.json()["error"]
    assert http.put(f"/v1/streams{path}/events").status_code == 201  # a stream may still be named so
    assert http.get(f"/v1/streams{path}/events").json()["path"] == f"{path}/events"
