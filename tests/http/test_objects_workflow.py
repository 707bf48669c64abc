"""Large objects over HTTP and the /api/workflow-streams surface."""

from __future__ import annotations

import hashlib
import time
import uuid

import pytest

import orjson
from httpx_sse import connect_sse

from .conftest import events_url

DATA = b"\x00\x01binary" * 5000
DIGEST = hashlib.sha256(DATA).hexdigest()


def code(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_object_flow(http, path):
    objects = events_url(path, "objects")
    r = http.post(objects, json={"idempotency_key": "u1", "sha256": DIGEST, "size": len(DATA), "content_type": "application/pdf"})
    assert r.status_code == 201
    obj = r.json()
    assert obj["state"] == "prepared"
    assert code(http.put(f"{objects}/{obj['object_id']}", content=DATA[:-1])) == (422, "object_mismatch")
    assert code(http.post(f"{objects}/{obj['object_id']}/commit")) == (409, "object_state")
    assert http.put(f"{objects}/{obj['object_id']}", content=DATA).json()["state"] == "uploaded"
    r = http.post(f"{objects}/{obj['object_id']}/commit", json={"type": "doc.ready", "payload": {"name": "a.pdf"}})
    assert r.status_code == 201
    committed = r.json()
    again = http.post(f"{objects}/{obj['object_id']}/commit", json={"type": "doc.ready", "payload": {"name": "a.pdf"}})
    assert again.json() == committed  # duplicate commit: the original offset
    record = http.get(f"{events_url(path)}/{committed['offset']}").json()
    assert record["payload"]["object"]["object_id"] == obj["object_id"]
    downloaded = http.get(f"{objects}/{obj['object_id']}/data")
    assert downloaded.content == DATA and downloaded.headers["content-type"] == "application/pdf"
    assert http.get(f"{objects}/{obj['object_id']}").json()["committed_offset"] == committed["offset"]
    assert code(http.get(f"{objects}/obj_nope")) == (404, "object_not_found")
    assert code(http.post(objects, json={"idempotency_key": "big", "sha256": DIGEST, "size": 33 * 1024 * 1024})) == (
        413, "object_too_large",
    )
    aborted = http.post(objects, json={"idempotency_key": "u2", "sha256": DIGEST, "size": len(DATA)}).json()
    assert http.post(f"{objects}/{aborted['object_id']}/abort").json()["state"] == "aborted"


def test_object_key_squat_bytes_before_commit_and_duplicate_commit(http, path):
    """Issue 10 as a tester reproduced it: a plain append squatting on the
    object's record key, bytes fetched before commit, a retried commit
    without its body."""
    objects = events_url(path, "objects")
    oid = http.post(objects, json={"idempotency_key": "sq", "sha256": DIGEST, "size": len(DATA)}).json()["object_id"]
    reference = {"object_id": oid, "sha256": DIGEST, "size": len(DATA), "content_type": "application/octet-stream"}
    squat = {"type": "object.committed", "payload": {"object": reference}, "idempotency_key": f"object:{oid}"}
    assert code(http.post(events_url(path), json=squat)) == (400, "reserved_idempotency_key")
    for state in ("prepared", "uploaded"):
        if state == "uploaded":
            assert http.put(f"{objects}/{oid}", content=DATA).json()["state"] == "uploaded"
        early = http.get(f"{objects}/{oid}/data")
        assert code(early) == (409, "object_not_committed") and early.json()["error"]["state"] == state
    r = http.post(f"{objects}/{oid}/commit", json={"type": "doc.ready", "payload": {"name": "a.pdf"}})
    assert r.status_code == 201
    committed = r.json()
    assert committed["offset"] == 1
    info = http.get(f"{objects}/{oid}").json()
    assert (info["state"], info["committed_offset"]) == ("committed", 1)
    # A retried commit returns the original, with no body or another one.
    for body in ({}, {"json": {"type": "other", "payload": {"x": 1}}}):
        again = http.post(f"{objects}/{oid}/commit", **body)
        assert (again.status_code, again.json()) == (201, committed)
    assert http.get(f"{objects}/{oid}/data").content == DATA
    assert [e["offset"] for e in http.get(events_url(path)).json()["events"]] == [1]


def test_expired_object_reports_expired_and_cannot_commit(http, path):
    objects = events_url(path, "objects")
    obj = http.post(objects, json={"idempotency_key": "e", "sha256": DIGEST, "size": len(DATA), "expires_in_s": 1}).json()
    while time.time() * 1000 <= obj["expires_at"]:  # wait for the clock to pass the expiry
        time.sleep(0.01)
    # The server's cleanup pass (every prune_interval_s) may remove the
    # expired object before it is asked: gone is terminal too.
    first = http.get(f"{objects}/{obj['object_id']}")
    if first.status_code == 404:
        assert code(first) == (404, "object_not_found")
    else:
        assert first.json()["state"] == "expired"
    for r in (http.put(f"{objects}/{obj['object_id']}", content=DATA), http.post(f"{objects}/{obj['object_id']}/commit")):
        if code(r) == (404, "object_not_found"):
            # removed by the cleanup pass meanwhile
            assert code(http.get(f"{objects}/{obj['object_id']}")) == (404, "object_not_found")
            continue
        assert code(r) == (409, "object_state") and r.json()["error"]["state"] == "expired"
    assert http.get(events_url(path)).json()["events"] == []  # nothing was committed


def test_closed_stream_refuses_prepare_and_upload(http, path):
    objects = events_url(path, "objects")
    obj = http.post(objects, json={"idempotency_key": "c", "sha256": DIGEST, "size": len(DATA)}).json()
    assert http.post(events_url(path, "close")).json()["closed"] is True
    assert code(http.post(objects, json={"idempotency_key": "new", "sha256": DIGEST, "size": len(DATA)})) == (
        409, "stream_closed",
    )
    assert code(http.put(f"{objects}/{obj['object_id']}", content=DATA)) == (409, "stream_closed")


def test_oversized_upload_is_refused(http, path):
    objects = events_url(path, "objects")
    obj = http.post(objects, json={"idempotency_key": "x", "sha256": DIGEST, "size": len(DATA)}).json()
    r = http.put(f"{objects}/{obj['object_id']}", content=b"x" * (32 * 1024 * 1024 + 1))
    assert code(r) == (413, "object_too_large")


def test_workflow_streams_surface(server, http):
    run = "run-" + uuid.uuid4().hex[:8]
    base = f"/api/workflow-streams/runs/{run}/streams"
    definition = {"stream_id": "output", "retention": {"max_events": 1000}, "limits": {"max_unread_events": 100},
                  "metadata": {"kind": "llm-output"}}
    r = http.post(base, json=definition)
    assert r.status_code == 201
    assert r.json()["path"] == f"/runs/{run}/output" and r.json()["pinned"] is True
    assert (r.json()["run_id"], r.json()["stream_id"]) == (run, "output")
    assert r.json()["lifetime_id"].startswith("str_")
    assert http.post(base, json=definition).status_code == 200  # same definition: a no-op
    changed = {**definition, "retention": {"max_events": 5}}
    assert code(http.post(base, json=changed)) == (409, "stream_exists")
    got = http.get(f"{base}/output").json()
    assert got["metadata"] == {"kind": "llm-output"} and got["retention"]["max_events"] == 1000
    # Pinned: the generic API cannot change retention either.
    assert code(http.put(f"/v1/streams/runs/{run}/output/-/retention", json={"max_events": 1})) == (409, "stream_pinned")

    r = http.post(f"{base}/output/records", json=[{"type": "chunk", "payload": i} for i in range(3)])
    assert [x["offset"] for x in r.json()["results"]] == [1, 2, 3]
    page = http.get(f"{base}/output/records", params={"after": 1}).json()
    assert [e["offset"] for e in page["events"]] == [2, 3]
    with server.client() as c, connect_sse(c, "GET", f"{base}/output/subscribe", params={"after": 1}) as source:
        received = []
        for sse in source.iter_sse():
            if not sse.data:  # a heartbeat (see test_sse.collect)
                continue
            received.append(orjson.loads(sse.data)["offset"])
            if len(received) == 2:
                break
    assert received == [2, 3]
    assert http.post(f"{base}/output/consumers/ui/ack", json={"offset": 3}).json()["acked"] == 3
    assert code(http.post(f"{base}/output/consumers/ui/ack", json={"offset": 2})) == (409, "ack_regression")
    assert http.put(f"{base}/output/legal-hold", json={"on": True}).json()["legal_hold"] is True

    obj = http.post(f"{base}/output/objects", json={"idempotency_key": "o", "sha256": DIGEST, "size": len(DATA)}).json()
    assert http.put(f"{base}/output/objects/{obj['object_id']}", content=DATA).status_code == 200
    assert http.post(f"{base}/output/objects/{obj['object_id']}/commit").json()["offset"] == 4
    other = http.post(f"{base}/output/objects", json={"idempotency_key": "p", "sha256": DIGEST, "size": len(DATA)}).json()
    assert http.post(f"{base}/output/objects/{other['object_id']}/abort").json()["state"] == "aborted"

    assert http.post(f"{base}/output/close").json()["closed"] is True
    assert code(http.post(f"{base}/output/records", json={"type": "late"})) == (409, "stream_closed")
    assert code(http.get(f"/api/workflow-streams/runs/{run}/streams/missing")) == (404, "stream_not_found")
    assert code(http.post(base, json={"stream_id": "bad id"})) == (400, "invalid_path")


@pytest.mark.parametrize(
    ("method", "url", "body", "status", "code"),
    [
        ("POST", "/v1/tokens", {"scopes": ["read"], "name": "n\u0000"}, 400, "invalid_input"),
        ("DELETE", "/v1/tokens/a%00b", None, 400, "invalid_input"),
        ("GET", "/v1/streams/nul/-/objects/obj%00x", None, 400, "invalid_input"),
        ("POST", "/v1/streams/nul/-/objects/obj%00x/abort", None, 400, "invalid_input"),
        ("POST", "/v1/streams/nul/-/objects", {"idempotency_key": "k\u0000", "sha256": DIGEST, "size": 1}, 400, "invalid_idempotency_key"),
        ("POST", "/v1/streams/nul/-/objects", {"idempotency_key": "k", "sha256": DIGEST, "size": 1, "content_type": "a\u0000"}, 400, "invalid_input"),
        ("PUT", "/v1/streams/nul-meta", {"metadata": {"x": "\u0000"}}, 400, "invalid_input"),
        ("PUT", "/v1/streams/nul-meta", {"metadata": {"\u0000": 1}}, 400, "invalid_input"),
    ],
)
def test_nul_characters_are_invalid_input_not_server_errors(http, method, url, body, status, code):
    r = http.request(method, url, json=body) if body is not None else http.request(method, url)
    assert (r.status_code, r.json()["error"]["code"]) == (status, code)
