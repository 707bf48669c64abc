"""PostgreSQL connection cuts under HTTP load, against a real ``yoke serve``.

Eight clients append with ``Idempotency-Key`` while every session of the
runtime role is terminated five times; readers and an SSE tail run along.
The only 5xx allowed is 503 ``unavailable`` with ``Retry-After``, after
which a client sends the same key again; every key lands exactly once and
the tail sees every event once, in order.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import httpx
import orjson
from httpx_sse import aconnect_sse

from tests.conftest import admin_sql
from tests.http.conftest import Server, events_url, start_server, stop_server

from .common import Cutter, Progress, assert_exact, pg_database

PATH = "/load"
CLIENTS = 8
CUTS = 5
APPENDS_PER_CUT = 150


def check_answer(response: httpx.Response, statuses: Counter, bad: list[str]) -> bool:
    """Record the status; True when the request should be sent again."""
    statuses[response.status_code] += 1
    if response.status_code == 503:
        body = response.json()
        if body["error"]["code"] != "unavailable" or "retry-after" not in response.headers:
            bad.append(f"503 without unavailable/Retry-After: {response.headers} {body}")
        return True
    if response.status_code >= 500:
        bad.append(f"{response.status_code}: {response.text[:300]}")
    return False


async def read_all(client: httpx.AsyncClient, path: str) -> list[dict]:
    events: list[dict] = []
    while True:
        r = await client.get(events_url(path), params={"after": events[-1]["offset"] if events else 0,
                                                       "limit": 10_000})
        if r.status_code == 503:
            continue  # reads retry inside; a 503 here means they ran out of patience
        r.raise_for_status()
        page = r.json()["events"]
        if not page:
            return events
        events += page


async def tail_sse(server: Server, path: str, into: list[dict], seen: Progress) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=None,
                                 headers={"Authorization": f"Bearer {server.token}"}) as client:
        async with aconnect_sse(client, "GET", events_url(path, "tail"), params={"after": 0}) as source:
            async for sse in source.aiter_sse():
                if sse.event == "error":
                    raise AssertionError(f"the tail ended with an error: {sse.data}")
                if sse.data:
                    into.append(orjson.loads(sse.data))
                    await seen.add()


async def test_cuts_under_http_load(tmp_path: Path) -> None:
    async with pg_database() as url, Cutter(url) as cutter:
        server = await asyncio.to_thread(start_server, url, tmp_path / ".yoke")
        try:
            headers = {"Authorization": f"Bearer {server.token}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
                r = await client.post(events_url(PATH), json={"type": "first", "idempotency_key": "first"})
                assert r.status_code == 201
                done = Progress()
                stop = asyncio.Event()
                keys = ["first"]
                statuses: Counter = Counter()
                bad: list[str] = []

                async def producer(c: int) -> None:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        key = f"c{c}-{n}"
                        while True:
                            r = await client.post(events_url(PATH), json={"type": "load", "payload": n},
                                                  headers={"Idempotency-Key": key})
                            if not check_answer(r, statuses, bad):
                                break
                        if r.status_code in (200, 201):
                            keys.append(key)
                        else:
                            bad.append(f"append {key}: {r.status_code} {r.text[:200]}")
                            return
                        await done.add()

                async def reader() -> None:
                    while not stop.is_set():
                        r = await client.get(events_url(PATH), params={"after": 0, "limit": 50})
                        check_answer(r, statuses, bad)

                tailed: list[dict] = []
                seen = Progress()
                tail = asyncio.create_task(tail_sse(server, PATH, tailed, seen))
                workers = [asyncio.create_task(producer(c)) for c in range(CLIENTS)]
                workers.append(asyncio.create_task(reader()))
                try:
                    for i in range(1, CUTS + 1):
                        await done.reach(i * APPENDS_PER_CUT, timeout_s=20)
                        assert not bad, bad
                        await cutter.cut()
                    await done.reach((CUTS + 1) * APPENDS_PER_CUT, timeout_s=20)
                finally:
                    stop.set()
                    await asyncio.gather(*workers)
                assert not bad, bad
                assert set(statuses) <= {200, 201, 503}, statuses

                events = await read_all(client, PATH)
                assert_exact(events, keys)
                await seen.reach(len(events), timeout_s=15)
                assert not tail.done(), tail  # it went on across the cuts
                tail.cancel()
                await asyncio.gather(tail, return_exceptions=True)
                assert [e["offset"] for e in tailed] == list(range(1, len(events) + 1))
                print(f"statuses {dict(statuses)}; sessions ended {cutter.sessions_ended}")
        finally:
            stop_server(server)
        log = next(tmp_path.glob("server-*.log")).read_text()
        assert "internal_error" not in log and "InternalClientError" not in log


async def test_an_unreachable_database_answers_503_with_retry_after(tmp_path: Path) -> None:
    async with pg_database() as url, Cutter(url) as cutter:
        server = await asyncio.to_thread(start_server, url, tmp_path / ".yoke")
        try:
            headers = {"Authorization": f"Bearer {server.token}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
                assert (await client.post(events_url(PATH), json={"type": "before"})).status_code == 201
                await admin_sql(f'ALTER DATABASE "{cutter.database}" ALLOW_CONNECTIONS false')
                try:
                    await cutter.cut()
                    for request in (
                        client.build_request("POST", events_url(PATH), json={"type": "during"}),
                        client.build_request("GET", events_url(PATH)),
                    ):
                        r = await client.send(request)
                        assert r.status_code == 503, (request.url, r.text)
                        assert r.headers["retry-after"] == "1"
                        assert r.json()["error"]["code"] == "unavailable"
                    assert (await client.get("/readyz")).status_code == 503
                finally:
                    await admin_sql(f'ALTER DATABASE "{cutter.database}" ALLOW_CONNECTIONS true')
                r = await client.post(events_url(PATH), json={"type": "after"})
                assert r.status_code == 201, r.text
                r = await client.get(events_url(PATH))
                assert [e["type"] for e in r.json()["events"]] == ["before", "after"]
        finally:
            stop_server(server)
