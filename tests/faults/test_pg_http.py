"""PostgreSQL connection cuts under HTTP load, against a real ``yoke serve``.

Eight clients append with ``Idempotency-Key`` while every session of the
runtime role is terminated five times; readers and an SSE tail run along.
The only 5xx allowed is 503 ``unavailable`` with ``Retry-After``, after
which a client sends the same key again; every key lands exactly once and
the tail sees every event once, in order.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from pathlib import Path

import httpx
import orjson
from httpx_sse import aconnect_sse

from tests.conftest import admin_sql
from tests.http.conftest import Server, events_url, start_server, stop_server

from .common import Canceller, Cutter, Progress, assert_exact, pg_database

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


CANCEL_CLIENTS = 4  # keyed batch clients, plus UNKEYED_CLIENTS unkeyed ones
UNKEYED_CLIENTS = 2
BATCH = 5
CANCEL_BATCHES = 400
ROLLED_BACK_REASONS = {"cancelled", "conflict"}


async def test_cancels_under_http_load(tmp_path: Path) -> None:
    """``pg_cancel_backend`` on every active runtime session of a real
    ``yoke serve``, every few milliseconds, under batch appends (keyed and
    unkeyed), reads and an SSE tail. The only 5xx is 503 ``unavailable``
    with reason ``cancelled`` or ``conflict`` and ``Retry-After``; a keyed
    batch sent again lands once; an unkeyed batch answered so is absent;
    the server logs no internal error and no driver exception."""
    async with pg_database() as url, Canceller(url) as canceller:
        server = await asyncio.to_thread(start_server, url, tmp_path / ".yoke")
        try:
            headers = {"Authorization": f"Bearer {server.token}"}
            async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=30) as client:
                r = await client.post(events_url(PATH), json={"type": "first", "idempotency_key": "first"})
                assert r.status_code == 201
                done = Progress()
                stop = asyncio.Event()
                keys = ["first"]
                unkeyed_ok: dict[str, int] = {}
                unkeyed_refused: set[str] = set()
                statuses: Counter = Counter()
                reasons: Counter = Counter()
                bad: list[str] = []

                def check(response: httpx.Response) -> bool:
                    """Record the answer; True for a 503 (the batch was not written)."""
                    retry = check_answer(response, statuses, bad)
                    if retry:
                        reason = response.json()["error"].get("reason")
                        reasons[reason] += 1
                        if reason not in ROLLED_BACK_REASONS:
                            bad.append(f"503 with reason {reason!r}: {response.text[:200]}")
                    return retry

                async def producer(c: int) -> None:
                    keyed = c < CANCEL_CLIENTS
                    n = 0
                    while not stop.is_set():
                        n += 1
                        ids = [f"c{c}-{n}-{i}" for i in range(BATCH)]
                        batch = [{"type": "load", "payload": {"id": i}} for i in ids]
                        if keyed:
                            for event, i in zip(batch, ids):
                                event["idempotency_key"] = i
                        while True:
                            r = await client.post(events_url(PATH), json=batch)
                            if not check(r) or not keyed:
                                break
                        if r.status_code in (200, 201):
                            if keyed:
                                keys.extend(ids)
                            else:
                                offsets = [x["offset"] for x in r.json()["results"]]
                                unkeyed_ok.update(zip(ids, offsets))
                        elif r.status_code == 503:
                            unkeyed_refused.update(ids)
                        else:
                            bad.append(f"append {ids[0]}: {r.status_code} {r.text[:200]}")
                        if bad:
                            stop.set()
                            return
                        await done.add()

                async def reader() -> None:
                    while not stop.is_set():
                        r = await client.get(events_url(PATH), params={"after": 0, "limit": 50})
                        check(r)

                tailed: list[dict] = []
                seen = Progress()
                tail = asyncio.create_task(tail_sse(server, PATH, tailed, seen))
                workers = [asyncio.create_task(producer(c)) for c in range(CANCEL_CLIENTS + UNKEYED_CLIENTS)]
                workers.append(asyncio.create_task(reader()))
                cancels = asyncio.create_task(canceller.run(stop, interval_s=0.003))
                try:
                    async with asyncio.timeout(120):
                        # Paced by the work and the cancels that hit appends, not by
                        # the clock: a loaded machine gets fewer cancels per batch.
                        while (done.count < CANCEL_BATCHES or canceller.appends_signalled < 20) \
                                and not stop.is_set():
                            await asyncio.sleep(0.05)
                finally:
                    stop.set()
                    await asyncio.gather(*workers, cancels)
                assert not bad, bad[:5]
                assert set(statuses) <= {200, 201, 503}, statuses

                events = await read_all(client, PATH)
                assert_exact(events, keys, unkeyed=True)
                by_id = {e["payload"]["id"]: e["offset"] for e in events if e.get("idempotency_key") is None
                         and isinstance(e.get("payload"), dict)}
                for i, offset in unkeyed_ok.items():
                    assert by_id.get(i) == offset, i
                assert not unkeyed_refused & set(by_id), sorted(unkeyed_refused & set(by_id))[:5]
                assert set(by_id) == set(unkeyed_ok)
                await seen.reach(len(events), timeout_s=15)
                assert not tail.done(), tail
                tail.cancel()
                await asyncio.gather(tail, return_exceptions=True)
                assert [e["offset"] for e in tailed] == list(range(1, len(events) + 1))
                print(f"statuses {dict(statuses)} reasons {dict(reasons)}; cancel signals {canceller.signalled}"
                      f" (appends {canceller.appends_signalled})")
        finally:
            stop_server(server)
        log = next(tmp_path.glob("server-*.log")).read_text()
        assert "internal_error" not in log, log[-2000:]
        # A driver exception in the log only as the cause of a Yoke error
        # (background passes log the Unavailable they retry after).
        lines = log.splitlines()
        for at, line in enumerate(lines):
            if re.match(r"asyncpg\.[\w.]+: ", line):
                following = next((x for x in lines[at + 1:] if x.strip()), "")
                assert following.startswith("The above exception was the direct cause"), line
        assert canceller.appends_signalled >= 20, canceller.appends_signalled  # appends were cancelled
