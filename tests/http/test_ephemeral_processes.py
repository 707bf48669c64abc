"""Ephemeral events across real ``yoke serve`` processes on one PostgreSQL
database: a tail on one server gets what another appends, in
offset order with the durable events; the receiving process's memory stays
under its caps; a restart forgets them."""

from __future__ import annotations

import re
import threading
import uuid

import httpx
import orjson
import pytest
from httpx_sse import connect_sse

from .conftest import Server, events_url, start_server, stop_server

KIB = 1024
CAPS = {
    "YOKE_EPHEMERAL_BUFFER_BYTES": str(16 * KIB),
    "YOKE_EPHEMERAL_TENANT_BYTES": str(48 * KIB),
    "YOKE_EPHEMERAL_PROCESS_BYTES": str(64 * KIB),
}


@pytest.fixture(scope="module")
def servers(pg_url, tmp_path_factory):
    a = start_server(pg_url, tmp_path_factory.mktemp("a") / ".yoke")
    b = start_server(pg_url, tmp_path_factory.mktemp("b") / ".yoke", **CAPS)
    try:
        yield a, b
    finally:
        stop_server(a)
        stop_server(b)


def tail_into(server: Server, token: str, path: str, count: int, got: list, ready: threading.Event) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        with connect_sse(c, "GET", events_url(path, "tail"), params={"after": 0}) as source:
            ready.set()
            for sse in source.iter_sse():
                if sse.data:
                    got.append(orjson.loads(sse.data))
                    if len(got) == count:
                        return


def gauge(server: Server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))


def test_a_tail_on_another_server_gets_them_in_order(servers):
    a, b = servers
    path = "/p/" + uuid.uuid4().hex[:8]
    with a.client() as c:
        c.post(events_url(path), json={"type": "start", "payload": 0}).raise_for_status()
        got: list = []
        ready = threading.Event()
        reader = threading.Thread(target=tail_into, args=(b, a.token, path, 41, got, ready))
        reader.start()
        assert ready.wait(30)
        for i in range(1, 41):
            body = {"type": "tok", "payload": {"i": i, "t": "ü" * i}, "ephemeral": i % 5 != 0}
            c.post(events_url(path), json=body).raise_for_status()
        reader.join(60)
        assert not reader.is_alive()
        expected = c.get(events_url(path), params={"after": 0, "include_ephemeral": True}).json()["events"]
    assert got == expected
    assert [e["offset"] for e in got] == list(range(1, 42))
    assert sum(e["ephemeral"] for e in got) == 32


def test_the_receiving_process_stays_under_its_caps_and_forgets_on_restart(servers, tmp_path_factory):
    a, b = servers
    paths = ["/flood/" + uuid.uuid4().hex[:8] for _ in range(8)]
    with a.client() as c:
        for path in paths:
            batch = [{"type": "pad", "payload": "x" * 900, "ephemeral": True} for _ in range(40)]
            c.post(events_url(path), json=batch).raise_for_status()
            c.post(events_url(path), json={"type": "done", "payload": None}).raise_for_status()
    with b.client(a.token) as c:
        # Reading each stream on b settles what was relayed (a barrier).
        kept = [c.get(events_url(p), params={"after": 0, "include_ephemeral": True, "limit": 100}).json()
                for p in paths]
        assert all(page["events"][-1]["type"] == "done" for page in kept)
        assert sum(len(page["events"]) - 1 for page in kept) < 8 * 40  # evicted under b's caps
        assert 0 < gauge(b, "yoke_ephemeral_bytes") <= 64 * KIB
        assert gauge(b, "yoke_ephemeral_relayed_total") >= 320
        newest = kept[-1]["events"][-2]
        assert newest["ephemeral"] and newest["offset"] == 40
    # A restart of b forgets them; a still has its own.
    stop_server(b)
    b2 = start_server(a.db_url, tmp_path_factory.mktemp("b2") / ".yoke", **CAPS)
    try:
        with b2.client(a.token) as c:
            page = c.get(events_url(paths[-1]), params={"after": 0, "include_ephemeral": True}).json()
            assert [e["offset"] for e in page["events"]] == [41]
    finally:
        stop_server(b2)
    with a.client() as c:
        page = c.get(events_url(paths[-1]), params={"after": 0, "include_ephemeral": True}).json()
        assert len(page["events"]) == 41
