"""Acknowledgements and producer credit over HTTP, including two servers on one PostgreSQL."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest

from .conftest import events_url, start_server, stop_server


def code(response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def ack_url(path: str, consumer: str) -> str:
    return f"{events_url(path, 'consumers')}/{consumer}/ack"


def test_acks_only_advance(http, path):
    http.post(events_url(path), json=[{"type": "e"}] * 5)
    assert http.post(ack_url(path, "worker"), json={"offset": 3}).json() == {"consumer": "worker", "acked": 3}
    assert code(http.post(ack_url(path, "worker"), json={"offset": 2})) == (409, "ack_regression")
    assert code(http.post(ack_url(path, "worker"), json={"offset": 9})) == (400, "invalid_ack")
    assert code(http.post(ack_url(path, "worker"), json={"offset": "x"})) == (400, "invalid_input")
    assert code(http.post(ack_url(path, "worker"), json={})) == (400, "invalid_input")
    assert code(http.post(ack_url("/missing/stream", "worker"), json={"offset": 0})) == (404, "stream_not_found")
    listed = http.get(events_url(path, "consumers")).json()["consumers"]
    assert [(c["consumer"], c["acked"]) for c in listed] == [("worker", 3)]
    assert http.delete(f"{events_url(path, 'consumers')}/worker").status_code == 204
    assert code(http.delete(f"{events_url(path, 'consumers')}/worker")) == (404, "consumer_not_found")


def test_backpressure_and_quota(http, path):
    http.put(f"/v1/streams{path}", json={"limits": {"max_unread_events": 2, "max_total_events": 4}})
    http.post(ack_url(path, "r"), json={"offset": 0})
    assert http.post(events_url(path), json=[{"type": "e"}] * 2).status_code == 201
    r = http.post(events_url(path), json={"type": "e"})
    assert code(r) == (429, "backpressure")
    assert int(r.headers["Retry-After"]) >= 1
    http.post(ack_url(path, "r"), json={"offset": 2})
    assert http.post(events_url(path), json=[{"type": "e"}] * 2).status_code == 201
    http.post(ack_url(path, "r"), json={"offset": 4})
    r = http.post(events_url(path), json={"type": "e"})
    assert code(r) == (507, "quota_exhausted")
    assert http.get(f"/v1/streams{path}").json()["head"] == 4


def test_blocking_overflow_waits_for_an_ack(http, server, path):
    http.put(
        f"/v1/streams{path}",
        json={"limits": {"max_unread_events": 1, "overflow": "block", "block_timeout_s": 20}},
    )
    http.post(ack_url(path, "r"), json={"offset": 0})
    http.post(events_url(path), json={"type": "first"})
    with concurrent.futures.ThreadPoolExecutor(1) as pool, server.client() as other:
        pending = pool.submit(other.post, events_url(path), json={"type": "second"})
        with pytest.raises(concurrent.futures.TimeoutError):
            pending.result(timeout=0.5)  # blocked on credit
        http.post(ack_url(path, "r"), json={"offset": 1})
        assert pending.result(timeout=20).json()["offset"] == 2


@pytest.mark.parametrize("server", ["postgres"], indirect=True)
def test_two_servers_share_one_credit_ceiling(server, tmp_path, path):
    second = start_server(server.db_url, tmp_path / ".yoke")
    try:
        with server.client() as a:
            a.put(f"/v1/streams{path}", json={"limits": {"max_unread_events": 60}})
            a.post(ack_url(path, "r"), json={"offset": 0})

        def push(url: str, token: str) -> int:
            ok = 0
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}) as c:
                for _ in range(50):
                    r = c.post(events_url(path), json={"type": "e"})
                    assert r.status_code in (201, 429), r.text
                    ok += r.status_code == 201
            return ok

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            results = list(pool.map(push, [server.url, second.url] * 2, [server.token, second.token] * 2))
        assert sum(results) == 60
        assert all(results)  # both servers took part
    finally:
        stop_server(second)
