"""The seed-004 surface in the seed's own words and data handling
(seed 004: "Exact cursor rule", "Data handling"), on both backends."""

from __future__ import annotations

import uuid

import orjson
from httpx_sse import connect_sse


def code(r):
    return r.status_code, r.json()["error"]["code"]


def new_run() -> str:
    return "run-" + uuid.uuid4().hex[:8]


def test_cursor_and_sequence_are_the_seeds_words(server, http):
    base = f"/api/workflow-streams/runs/{new_run()}/streams"
    assert http.post(base, json={"stream_id": "out"}).status_code == 201
    http.post(f"{base}/out/records", json=[{"type": "chunk", "payload": i} for i in range(5)]).raise_for_status()
    records = f"{base}/out/records"
    assert [e["offset"] for e in http.get(records, params={"cursor": 3}).json()["events"]] == [4, 5]
    assert [e["offset"] for e in http.get(records, params={"cursor": 3, "after": 3}).json()["events"]] == [4, 5]
    r = http.get(records, params={"cursor": 3, "after": 2})
    assert code(r) == (400, "invalid_input") and "cursor" in r.json()["error"]["message"]
    # Words the route does not take are refused, naming the one meant.
    r = http.get(records, params={"sequence": 3})
    assert code(r) == (400, "invalid_input")
    assert r.json()["error"]["hint"] == "cursor" and r.json()["error"]["field"] == "sequence"
    assert code(http.get(records, params={"curser": 3})) == (400, "invalid_input")
    assert code(http.get(records, params={"cursor": 9})) == (400, "invalid_cursor")
    with server.client() as c, connect_sse(c, "GET", f"{base}/out/subscribe", params={"cursor": 3}) as source:
        got = []
        for sse in source.iter_sse():
            if sse.data:
                got.append(orjson.loads(sse.data)["offset"])
                if len(got) == 2:
                    break
    assert got == [4, 5]
    assert code(http.get(f"{base}/out/subscribe", params={"offset": 3})) == (400, "invalid_input")
    # Acknowledged by sequence (or offset; both must agree).
    assert http.post(f"{base}/out/consumers/ui/ack", json={"sequence": 2}).json()["acked"] == 2
    assert http.post(f"{base}/out/consumers/ui/ack", json={"offset": 3}).json()["acked"] == 3
    assert code(http.post(f"{base}/out/consumers/ui/ack", json={"sequence": 4, "offset": 5})) == (400, "invalid_input")
    assert code(http.post(f"{base}/out/consumers/ui/ack", json={"sequence": 1})) == (409, "ack_regression")
