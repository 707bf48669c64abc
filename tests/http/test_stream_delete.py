"""DELETE /v1/streams/{path} and `yoke stream delete` against a real server, on both backends."""

from __future__ import annotations

import threading

import orjson
from httpx_sse import connect_sse

from .conftest import events_url
from .test_edges import until_the_end


def error_of(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_delete_then_create_again(http, path):
    http.post(events_url(path), json=[{"type": "a"}, {"type": "b"}])
    http.post(f"{events_url(path, 'consumers')}/reader/ack", json={"offset": 1})
    before = http.get(f"/v1/streams{path}").json()
    r = http.delete(f"/v1/streams{path}")
    assert r.status_code == 200
    assert {k: r.json()[k] for k in ("path", "stream_id", "head")} == {
        "path": path, "stream_id": before["stream_id"], "head": 2,
    }
    assert error_of(http.get(f"/v1/streams{path}")) == (404, "stream_not_found")
    assert error_of(http.get(events_url(path))) == (404, "stream_not_found")
    assert error_of(http.delete(f"/v1/streams{path}")) == (404, "stream_not_found")
    r = http.post(events_url(path), json={"type": "c"})
    assert r.status_code == 201 and r.json()["offset"] == 1
    after = http.get(f"/v1/streams{path}").json()
    assert after["stream_id"] != before["stream_id"] and after["created_at"] > before["created_at"]
    assert http.get(events_url(path, "consumers")).json()["consumers"] == []


def test_legal_hold_the_global_stream_and_scopes(server, http, path):
    http.post(events_url(path), json={"type": "a"})
    assert http.put(f"/v1/streams{path}/-/legal-hold", json={"on": True}).status_code == 200
    r = http.delete(f"/v1/streams{path}")
    assert error_of(r) == (409, "legal_hold") and r.json()["error"]["path"] == path
    assert len(http.get(events_url(path)).json()["events"]) == 1
    assert error_of(http.delete("/v1/streams/")) == (400, "global_stream")
    tenant = http.get(f"/v1/streams{path}").json()["tenant"]
    with server.client(server.new_token(tenant, "read,append")) as reader:
        assert error_of(reader.delete(f"/v1/streams{path}")) == (403, "forbidden")
    assert http.put(f"/v1/streams{path}/-/legal-hold", json={"on": False}).status_code == 200
    assert http.delete(f"/v1/streams{path}").status_code == 200


def test_a_live_sse_tail_ends_with_a_deleted_event(server, http, path):
    http.post(events_url(path), json={"type": "a"})
    stream_id = http.get(f"/v1/streams{path}").json()["stream_id"]
    with server.client() as c, connect_sse(c, "GET", events_url(path, "tail")) as source:
        frames = source.iter_sse()
        assert next(f for f in frames if f.data).id == "1"
        deleter = threading.Thread(target=lambda: http.delete(f"/v1/streams{path}"))
        deleter.start()
        rest = until_the_end(frames)
        deleter.join()
    assert [f.event for f in rest] == ["deleted"]
    assert orjson.loads(rest[0].data) == {"path": path, "deleted": True, "stream_id": stream_id}


def test_cli_asks_first_and_deletes_with_yes(server, http, path):
    http.post(events_url(path), json=[{"type": "a"}] * 3)
    refused = server.cli("stream", "delete", path, "--url", server.url, check=False)
    assert refused.returncode == 1 and "--yes" in refused.stderr
    assert http.get(f"/v1/streams{path}").status_code == 200  # nothing deleted
    out = server.cli("stream", "delete", path, "--yes", "--url", server.url)
    assert out.stdout.startswith(f"deleted {path} (stream id str_")
    assert http.get(f"/v1/streams{path}").status_code == 404
    http.post(events_url(path), json={"type": "a"})
    deleted = orjson.loads(server.cli("stream", "delete", path, "-y", "--json", "--url", server.url).stdout)
    assert deleted["path"] == path and deleted["head"] == 1
    held = server.cli("stream", "delete", "/", "--yes", "--url", server.url, check=False)
    assert held.returncode == 1 and "global stream" in held.stderr
