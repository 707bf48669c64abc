"""The /v1 streams API against a real server, on both backends."""

from __future__ import annotations

import time

import pytest

from .conftest import events_url


def error_of(response) -> dict:
    body = response.json()
    assert set(body) == {"error"}, body
    return body["error"]


def test_append_read_and_the_cursor_rule(http, path):
    r = http.post(events_url(path), json={"type": "order.placed", "payload": {"id": 7}})
    assert r.status_code == 201
    first = r.json()
    assert first["offset"] == 1 and first["id"]
    r = http.post(events_url(path), json=[{"type": "a"}, {"type": "b", "ephemeral": True}, {"type": "c"}])
    assert r.status_code == 201
    assert [x["offset"] for x in r.json()["results"]] == [2, 3, 4]

    page = http.get(events_url(path), params={"after": 0}).json()
    assert [e["offset"] for e in page["events"]] == [1, 2, 4] and page["next_after"] == 4
    assert page["events"][0]["payload"] == {"id": 7}
    with_ephemeral = http.get(events_url(path), params={"after": 1, "include_ephemeral": "true"}).json()
    assert [e["offset"] for e in with_ephemeral["events"]] == [2, 3, 4]
    assert [e["offset"] for e in http.get(events_url(path), params={"after": 1, "limit": 1}).json()["events"]] == [2]

    r = http.get(events_url(path), params={"after": 5})
    assert r.status_code == 400
    assert error_of(r) == {
        "code": "invalid_cursor", "message": "cursor 5 is beyond the head 4", "requested": 5, "latest": 4,
    }
    assert http.get(f"{events_url(path)}/1").json()["type"] == "order.placed"
    r = http.get(f"{events_url(path)}/99")
    assert (r.status_code, error_of(r)["code"]) == (404, "event_not_found")


def test_idempotency_key_header(http, path):
    headers = {"Idempotency-Key": "pay-1"}
    first = http.post(events_url(path), json={"type": "pay", "payload": 5}, headers=headers)
    again = http.post(events_url(path), json={"type": "pay", "payload": 5}, headers=headers)
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    r = http.post(events_url(path), json={"type": "pay", "payload": 6}, headers=headers)
    assert (r.status_code, error_of(r)["code"]) == (409, "idempotency_conflict")
    r = http.post(events_url(path), json=[{"type": "x"}], headers=headers)
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_input")
    assert len(http.get(events_url(path)).json()["events"]) == 1


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_input"),
        (b"", 400, "invalid_input"),
        (b'{"type": "has space"}', 400, "invalid_event_type"),
        (b'{"type": "a", "extra": 1}', 400, "unknown_field"),
        (b'{"type": "yoke.kernel"}', 400, "reserved_event_type"),
        (b'{"type": "a", "idempotency_key": ""}', 400, "invalid_idempotency_key"),
        (b'{"type": "a", "ephemeral": true, "idempotency_key": "k"}', 400, "ephemeral_idempotency_key"),
        (b'{"type": "a", "source": {"copied_from": []}}', 400, "forged_source"),
        (b'{"type": "a", "priority": "x"}', 400, "invalid_event"),
        (b'{"type": "a", "payload": "' + b"x" * 70000 + b'"}', 413, "event_too_large"),
        (b"42", 400, "invalid_event"),
    ],
)
def test_append_errors(http, path, body, status, code):
    r = http.post(events_url(path), content=body, headers={"Content-Type": "application/json"})
    assert (r.status_code, error_of(r)["code"]) == (status, code)
    assert error_of(r)["message"]
    assert http.get(f"/v1/streams{path}").status_code == 404  # nothing was created


def test_invalid_paths_and_unknown_routes(http):
    r = http.post("/v1/streams/a//b/-/events", json={"type": "x"})
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_path")
    r = http.get("/v1/streams/a/-/nonsense")
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_path")
    r = http.get("/v2/whatever")
    assert (r.status_code, error_of(r)["code"]) == (404, "not_found")
    r = http.delete("/healthz")
    assert (r.status_code, error_of(r)["code"]) == (405, "method_not_allowed")
    r = http.get("/v1/streams/x/-/events", params={"after": -1})
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_input")


def test_root_stream(http, server):
    other = server.new_token("root" + str(time.time_ns()), "read,append")
    with server.client(other) as c:
        assert c.post("/v1/streams/-/events", json={"type": "hi"}).status_code == 201
        assert c.get("/v1/streams/").json()["path"] == "/"
        assert [e["type"] for e in c.get("/v1/streams/-/events").json()["events"]] == ["hi"]


def test_stream_settings(http, path):
    r = http.put(f"/v1/streams{path}", json={"retention": {"max_events": 100}, "metadata": {"team": "a"}})
    assert r.status_code == 201
    info = r.json()
    assert info["retention"]["max_events"] == 100 and info["metadata"] == {"team": "a"} and info["head"] == 0
    same = {"retention": {"max_events": 100}, "metadata": {"team": "a"}}
    assert http.put(f"/v1/streams{path}", json=same).status_code == 200  # exists already, same definition
    assert http.put(f"/v1/streams{path}", json={}).json()["error"]["code"] == "stream_exists"  # another one
    listed = http.get("/v1/streams", params={"prefix": path}).json()["streams"]
    assert [s["path"] for s in listed] == [path]

    r = http.put(events_url(path, "retention"), json={"max_age_s": 3600, "max_events": None})
    assert r.json()["retention"] == {"max_age_s": 3600.0, "max_events": None}
    r = http.put(events_url(path, "retention"), json={"max_age_s": -1})
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_input")
    assert http.put(events_url(path, "legal-hold"), json={"on": True}).json()["legal_hold"] is True
    r = http.put(events_url(path, "limits"), json={"max_unread_events": 10, "overflow": "reject"})
    assert r.json()["limits"]["max_unread_events"] == 10
    r = http.put(events_url(path, "limits"), json={"max_unread_events": 10, "mystery": 1})
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_input")

    http.post(events_url(path), json={"type": "x"})
    closed = http.post(events_url(path, "close"))
    assert closed.json()["closed"] is True
    r = http.post(events_url(path), json={"type": "y"})
    assert (r.status_code, error_of(r)["code"]) == (409, "stream_closed")
    assert http.get(f"/v1/streams{path}").json()["head"] == 1
    r = http.get("/v1/streams/never/made")
    assert (r.status_code, error_of(r)["code"]) == (404, "stream_not_found")


def test_cursor_gone_after_retention(http, path):
    http.post(events_url(path), json=[{"type": "e", "payload": i} for i in range(10)])
    http.put(events_url(path, "retention"), json={"max_events": 3})
    # The server prunes every 0.2 s in these tests; wait for it.
    deadline = time.monotonic() + 20
    while http.get(f"/v1/streams{path}").json()["earliest"] != 8:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    r = http.get(events_url(path), params={"after": 2})
    assert r.status_code == 410
    assert error_of(r) == {
        "code": "cursor_gone",
        "message": "events after 2 were removed by retention",
        "requested": 2, "earliest": 8, "latest": 10, "reason": "retention",
    }
    assert [e["offset"] for e in http.get(events_url(path), params={"after": 7}).json()["events"]] == [8, 9, 10]


def test_health_readiness_metrics_docs(http, server):
    assert http.get("/healthz").json() == {"status": "ok"}
    assert http.get("/readyz").json() == {"status": "ready"}
    http.post(events_url("/metrics-check"), json={"type": "x"})
    text = http.get("/metrics").text
    assert 'yoke_stream_appends_total{tenant="default"}' in text
    assert "yoke_append_latency_seconds_bucket" in text
    assert "yoke_open_tails" in text
    assert 'yoke_http_requests_total{method="POST",route="/v1/streams{path:path}/-/events",status="201"}' in text
    assert http.get("/openapi.json").json()["info"]["title"] == "Yoke"
    assert "swagger" in http.get("/docs").text.lower()


def test_request_metrics_count_every_request_by_route_method_and_status(http, server):
    """The request metrics keep their label children between requests:
    each request still counts, under its own status."""
    route = 'route="/v1/streams{path:path}/-/events"'

    def counted(status: int) -> float:
        line = f'yoke_http_requests_total{{method="POST",{route},status="{status}"}} '
        for row in http.get("/metrics").text.splitlines():
            if row.startswith(line):
                return float(row[len(line):])
        return 0.0

    def timed() -> float:
        line = f'yoke_http_request_seconds_count{{{route}}} '
        return next(float(r[len(line):]) for r in http.get("/metrics").text.splitlines() if r.startswith(line))

    http.post(events_url("/metrics-count"), json={"type": "x"})  # the children exist
    ok, bad, seen = counted(201), counted(400), timed()
    for _ in range(3):
        assert http.post(events_url("/metrics-count"), json={"type": "x"}).status_code == 201
    assert http.post(events_url("/metrics-count"), content=b"{", headers={"Content-Type": "application/json"}).status_code == 400
    assert (counted(201), counted(400), timed()) == (ok + 3, bad + 1, seen + 4)


def test_hot_path_matches_the_framework_routes(http, path):
    # A percent-encoded slash is part of a segment, never a separator.
    r = http.post("/v1/streams/a%252Fb/-/events", json={"type": "x"})
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_path")
    r = http.post(events_url(path), params={"tenant": ""}, json={"type": "x"})
    assert (r.status_code, error_of(r)["code"]) == (403, "forbidden")
    r = http.post(events_url(path), json=[])
    assert (r.status_code, error_of(r)["code"]) == (400, "invalid_input")


def test_object_content_type_must_be_a_header_value(http, path):
    for bad in ("text/€", "text/plain\r\nX-Evil: 1", ""):
        r = http.post(events_url(path, "objects"), json={"idempotency_key": "k", "sha256": "0" * 64, "size": 1, "content_type": bad})
        assert (r.status_code, error_of(r)["code"]) == (400, "invalid_input")
