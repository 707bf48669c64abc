"""Session connections over SSE (GET .../-/connection) against a real
server with a real SSE client: replay then live, the filter, state updates,
replacement by key, ends and their facts on '/'."""

from __future__ import annotations

import time

import orjson
from httpx_sse import connect_sse

from .conftest import events_url

DEADLINE_S = 20


def frames(source):  # noqa: ANN001, ANN201
    """(event name, data) of each frame with data (heartbeats skipped)."""
    for sse in source.iter_sse():
        if sse.data:
            yield sse.event, orjson.loads(sse.data)


def connection_url(path: str) -> str:
    return events_url(path, "connection")


def facts_of(http, connection_id: str) -> list[dict]:  # noqa: ANN001
    events = http.get("/v1/streams/-/events", params={"limit": 10_000}).json()["events"]
    return [e for e in events if e["type"].startswith("yoke.stream.connection")
            and e["payload"]["connection_id"] == connection_id]


def wait_for_close_fact(http, connection_id: str) -> dict:  # noqa: ANN001
    deadline = time.monotonic() + DEADLINE_S
    while True:
        closed = [f for f in facts_of(http, connection_id) if f["type"] == "yoke.stream.connection_closed"]
        if closed:
            return closed[0]["payload"]
        assert time.monotonic() < deadline, "the connection's end was not recorded"
        time.sleep(0.05)


def test_replay_then_live_with_a_filter_and_disconnect_closes_it(server, http, path):
    http.post(events_url(path), json=[{"type": "msg", "payload": {"n": 1}}, {"type": "other"}])
    with server.client() as c, connect_sse(
        c, "GET", connection_url(path), params={"key": "browser", "after": 0, "types": "msg"}
    ) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        it = frames(source)
        kind, opened = next(it)
        assert kind == "opened" and opened["connection_key"] == "browser" and opened["after"] == 0
        kind, first = next(it)
        assert (kind, first["offset"], first["payload"]) == ("message", 1, {"n": 1})
        http.post(events_url(path), json=[{"type": "other"}, {"type": "msg", "payload": {"n": 2}}])
        kind, live = next(it)
        assert (live["offset"], live["payload"]) == (4, {"n": 2})
    # The client went away: the connection ends, recorded on '/'.
    closed = wait_for_close_fact(http, opened["connection_id"])
    assert closed["reason"] == "disconnected" and closed["path"] == path
    [fact] = [f for f in facts_of(http, opened["connection_id"]) if f["type"].endswith("opened")]
    assert fact["payload"]["connection_key"] == "browser" and fact["payload"]["replay_after"] == 0
    # Nothing was appended to the stream itself, no subscription either.
    assert [e["type"] for e in http.get(events_url(path)).json()["events"]] == ["msg", "other", "other", "msg"]
    assert http.get(f"/v1/streams{path}/-/subscriptions").json()["subscriptions"] == []


def test_the_same_key_replaces_and_a_closed_stream_ends_it(server, http, path):
    http.post(events_url(path), json={"type": "x"})
    with server.client() as a_client, server.client() as b_client:
        with connect_sse(a_client, "GET", connection_url(path), params={"key": "tab"}) as a:
            a_frames = frames(a)
            assert next(a_frames)[0] == "opened"
            with connect_sse(b_client, "GET", connection_url(path), params={"key": "tab"}) as b:
                b_frames = frames(b)
                assert next(b_frames)[0] == "opened"
                assert next(a_frames) == ("ended", {"reason": "replaced"})
                http.post(events_url(path), json={"type": "y"})
                assert next(b_frames)[1]["type"] == "y"
                http.post(f"/v1/streams{path}/-/close")
                assert next(b_frames) == ("ended", {"reason": "stream_closed"})


def test_state_updates_instead_of_events(server, http, path):
    http.post(events_url(path), json={"type": "x"})
    with server.client() as c, connect_sse(
        c, "GET", connection_url(path), params={"key": "ui", "events": "false"}
    ) as source:
        it = frames(source)
        assert next(it)[0] == "opened"
        kind, state = next(it)
        assert kind == "state" and state["subscriptions"]["outbound"]["by_name"] == {}
        made = http.post(f"/v1/streams{path}/-/subscriptions", json={
            "name": "mirror", "receiver": {"kind": "copy", "target": path + "-mirror"},
        })
        assert made.status_code == 201
        kind, state = next(it)
        assert kind == "state"
        mirror = state["subscriptions"]["outbound"]["by_name"]["mirror"]
        assert mirror["configured_at_offset"] == made.json()["offset"]


def test_bad_connections_are_plain_errors(server, http, path):
    http.post(events_url(path), json={"type": "x"})
    for params, code in (
        ({}, "invalid_input"),  # no key
        ({"key": "k", "after": 9}, "invalid_cursor"),
        ({"key": "k", "where": "payload.("}, "invalid_filter"),
    ):
        r = http.get(connection_url(path), params=params)
        assert (r.status_code, r.json()["error"]["code"]) == (400, code), params
