"""Live tails over Server-Sent Events with a real SSE client."""

from __future__ import annotations

import threading
import time

import httpx
import orjson
from httpx_sse import connect_sse

from .conftest import events_url


def collect(client: httpx.Client, path: str, count: int, **params) -> list[tuple[str, dict]]:
    """Open a tail, read ``count`` events, then drop the connection."""
    headers = params.pop("headers", {})
    got: list[tuple[str, dict]] = []
    with connect_sse(client, "GET", events_url(path, "tail"), params=params, headers=headers) as source:
        assert source.response.headers["content-type"].startswith("text/event-stream")
        for sse in source.iter_sse():
            if not sse.data:
                # A heartbeat: httpx-sse reports a comment-only frame as an
                # event without data once an id has been seen.
                continue
            got.append((sse.id, orjson.loads(sse.data)))
            if len(got) == count:
                break
    return got


def test_tail_backfills_then_follows_live(server, http, path):
    http.post(events_url(path), json=[{"type": "old", "payload": i} for i in range(3)])

    def append_later():
        time.sleep(0.2)
        with server.client() as c:
            for i in range(3, 6):
                c.post(events_url(path), json={"type": "new", "payload": i})

    writer = threading.Thread(target=append_later)
    writer.start()
    with server.client() as c:
        got = collect(c, path, 6, after=0)
    writer.join()
    assert [(sse_id, e["offset"], e["payload"]) for sse_id, e in got] == [
        (str(i + 1), i + 1, i) for i in range(6)
    ]


def test_reconnect_with_last_event_id_skips_and_repeats_nothing(server, http, path):
    total = 120
    stop = threading.Event()

    def produce():
        with server.client() as c:
            for i in range(total):
                c.post(events_url(path), json={"type": "x", "payload": i})
        stop.set()

    writer = threading.Thread(target=produce)
    writer.start()
    seen: list[int] = []
    last_id = None
    with server.client() as c:
        while len(seen) < total:
            # Kill the connection every 17 events, reconnect from Last-Event-ID.
            headers = {"Last-Event-ID": last_id} if last_id else {}
            chunk = collect(c, path, min(17, total - len(seen)), after=0, headers=headers)
            seen += [e["payload"] for _, e in chunk]
            last_id = chunk[-1][0]
    writer.join()
    assert seen == list(range(total))


def test_after_parameter_and_bad_cursors(server, http, path):
    http.post(events_url(path), json=[{"type": "x", "payload": i} for i in range(5)])
    with server.client() as c:
        assert [e["offset"] for _, e in collect(c, path, 2, after=3)] == [4, 5]
    r = http.get(events_url(path, "tail"), params={"after": 99})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_cursor")
    r = http.get(events_url(path, "tail"), headers={"Last-Event-ID": "abc"})
    assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_input")  # not an offset, as ?after=abc


def test_heartbeats_keep_idle_tails_open(server, path):
    # The test server sends a heartbeat comment every 0.5 s.
    with server.client() as c, c.stream("GET", events_url(path, "tail")) as response:
        lines = response.iter_lines()
        assert next(lines) == ": tailing"
        comments = 0
        for line in lines:
            if line == ": ping":
                comments += 1
                if comments == 2:
                    break
        assert comments == 2


def test_tail_reports_cursor_gone_as_an_error_event(server, http, path):
    # 6000 events of 2 KB (12 MB) are far more than the socket buffers
    # hold, so the tail is still sending early pages when retention removes
    # what its next page would start with.
    total = 6000
    for _ in range(6):
        http.post(events_url(path), json=[{"type": "x", "payload": "p" * 2000}] * 1000)
    with server.client() as c, connect_sse(c, "GET", events_url(path, "tail"), params={"after": 0}) as source:
        events = source.iter_sse()
        assert next(events).id == "1"
        http.put(events_url(path, "retention"), json={"max_events": 1})
        deadline = time.monotonic() + 20
        while http.get(f"/v1/streams{path}").json()["earliest"] != total:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        delivered = 1
        for sse in events:
            if sse.event == "error":
                error = orjson.loads(sse.data)["error"]
                assert error["code"] == "cursor_gone" and error["earliest"] == total
                break
            delivered += 1
            assert delivered < total, "the whole stream arrived: the tail was never behind"
        else:
            raise AssertionError("the tail ended without an error event")


def test_a_filtered_tail_sends_only_matches_and_resumes_by_offset(server, http, path):
    http.post(events_url(path), json=[
        {"type": "msg", "payload": {"n": 1, "visible": True}},
        {"type": "msg", "payload": {"n": 2, "visible": False}},
        {"type": "note", "payload": {"n": 3, "visible": True}},
        {"type": "msg", "payload": {"n": 4, "visible": True}},
    ])
    with server.client() as c:
        got = collect(c, path, 2, after=0, types="msg", where="payload.visible = true")
        assert [(sse_id, e["payload"]["n"]) for sse_id, e in got] == [("1", 1), ("4", 4)]
        resumed = collect(c, path, 1, headers={"Last-Event-ID": "1"}, types="msg,note",
                          where="payload.visible = true")
        assert [e["payload"]["n"] for _, e in resumed] == [3]


def test_a_failing_filter_closes_the_tail_with_an_error_event(server, http, path):
    http.post(events_url(path), json={"type": "msg", "payload": {"v": "text"}})
    with server.client() as c:
        with connect_sse(c, "GET", events_url(path, "tail"),
                         params={"after": 0, "where": "$number(payload.v) > 1"}) as source:
            events = list(source.iter_sse())
    assert events[-1].event == "error"
    assert orjson.loads(events[-1].data)["error"]["code"] == "filter_failed"
    bad = http.get(events_url(path, "tail"), params={"where": "payload.("})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_filter"


def _tail_error(server, path: str, where: str) -> dict:
    """The error a tail from offset 0 with ``where`` ends with."""
    with server.client() as c:
        with connect_sse(c, "GET", events_url(path, "tail"), params={"after": 0, "where": where}) as source:
            events = list(source.iter_sse())
    assert events[-1].event == "error"
    return orjson.loads(events[-1].data)["error"]


def test_a_filter_that_never_ends_is_cut_off_and_the_server_answers_meanwhile(server, http, path):
    """A where= that applies a function to itself loops forever on the event
    loop: it froze every request of the server. Its evaluation is cut off
    (filters.EVALUATION_TIMEOUT_MS) and ends the tail with filter_failed."""
    http.post(events_url(path), json={"type": "msg", "payload": {"v": 1}})
    error = _tail_error(server, path, "(function($f){$f($f)})(function($f){$f($f)})")
    assert error["code"] == "filter_failed" and "timeout" in error["message"].lower()
    assert http.get("/healthz").status_code == 200


def test_a_backtracking_regex_in_a_filter_is_cut_off_and_the_server_answers_meanwhile(server, http, path):
    """A where= whose regex backtracks catastrophically on an event is one
    step of the evaluation (the bound above is checked between steps): it
    held the event loop, so every request of the server, for as long as the
    match ran (here about 2^60 steps). The match is bounded on its own."""
    http.post(events_url(path), json={"type": "msg", "payload": {"s": "a" * 60 + "b"}})
    error = _tail_error(server, path, "$count($match(payload.s, /(a|aa)+$/)) > 0")
    assert error["code"] == "filter_failed" and "timed out" in error["message"]
    assert http.get("/healthz").status_code == 200


def test_a_stream_created_again_is_tailed_with_its_own_events(server, http, path):
    """Tails share encoded frames, keyed by stream and offset: a stream
    deleted and created again reuses its offsets, so the key holds the
    event's id too, or the new stream's tail would replay the old events."""
    http.post(events_url(path), json=[{"type": "old", "payload": i} for i in range(3)])
    assert [e["payload"] for _, e in collect(http, path, 3, after=0)] == [0, 1, 2]
    assert http.delete(f"/v1/streams{path}").status_code == 200
    http.post(events_url(path), json=[{"type": "new", "payload": i} for i in range(10, 13)])
    assert [(e["type"], e["payload"]) for _, e in collect(http, path, 3, after=0)] == [
        ("new", 10), ("new", 11), ("new", 12)
    ]
