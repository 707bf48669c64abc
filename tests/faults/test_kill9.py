"""``yoke serve`` killed with SIGKILL under idempotent HTTP load, restarted,
on both backends.

Clients append single events with ``Idempotency-Key``. When the server
dies under them (a reset connection, a refused one, or a 503 while it
shuts down) the outcome of the request in flight is unknown, so they send
the same key again to the restarted server. In the end every key is in the
stream exactly once and the offsets run from 1 with no gap.
"""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.http.conftest import Server, events_url, start_server, stop_server

from .common import Progress, assert_exact, pg_database

PATH = "/kill9"
CLIENTS = 6
KEYS_PER_CLIENT = 80
KILLS = 1  # each restart costs a server start (seconds on a loaded machine)


@pytest.fixture(params=["sqlite", "postgres"])
async def db_url(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/yoke.db"
        return
    async with pg_database("yoke_kill9") as url:
        yield url


async def test_kill_9_under_idempotent_http_load(db_url: str, tmp_path: Path) -> None:
    data_dir = tmp_path / ".yoke"
    server: Server = await asyncio.to_thread(start_server, db_url, data_dir)
    up = asyncio.Event()
    up.set()
    done = Progress()
    statuses: Counter = Counter()
    bad: list[str] = []
    transport_errors = 0

    async def client_loop(c: int) -> None:
        nonlocal transport_errors
        http: httpx.AsyncClient | None = None
        http_of: Server | None = None
        try:
            for n in range(KEYS_PER_CLIENT):
                key = f"c{c}-{n}"
                while True:
                    await up.wait()
                    current = server
                    if http_of is not current:
                        if http is not None:
                            await http.aclose()
                        http, http_of = httpx.AsyncClient(base_url=current.url, timeout=30), current
                    try:
                        r = await http.post(
                            events_url(PATH), json={"type": "load", "payload": {"c": c, "n": n}},
                            headers={"Idempotency-Key": key, "Authorization": f"Bearer {current.token}"},
                        )
                    except httpx.TransportError as exc:
                        if current is server and up.is_set():
                            bad.append(f"{key}: {exc!r} from a server that is up")
                            return
                        transport_errors += 1
                        continue  # the server died under the request: same key, once it is back
                    statuses[r.status_code] += 1
                    if r.status_code in (200, 201):
                        break
                    if r.status_code == 503 and "retry-after" in r.headers:
                        continue  # shutting down or unavailable: same key again
                    bad.append(f"{key}: {r.status_code} {r.text[:300]}")
                    return
                await done.add()
        finally:
            if http is not None:
                await http.aclose()

    clients = [asyncio.create_task(client_loop(c)) for c in range(CLIENTS)]
    try:
        total = CLIENTS * KEYS_PER_CLIENT
        for k in range(1, KILLS + 1):
            await done.reach(k * total // (KILLS + 1), timeout_s=30)
            up.clear()
            server.process.send_signal(signal.SIGKILL)
            await asyncio.to_thread(server.process.wait)
            server = await asyncio.to_thread(start_server, db_url, data_dir)
            up.set()
        await asyncio.wait_for(asyncio.gather(*clients), timeout=30)
        assert not bad, bad
        assert set(statuses) <= {200, 201, 503}, statuses

        async with httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=30
        ) as http:
            r = await http.get(events_url(PATH), params={"after": 0, "limit": 10_000})
            assert r.status_code == 200, r.text
            events = r.json()["events"]
        assert_exact(events, [f"c{c}-{n}" for c in range(CLIENTS) for n in range(KEYS_PER_CLIENT)])
        print(f"statuses {dict(statuses)}; transport errors {transport_errors}")
    finally:
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        stop_server(server)
