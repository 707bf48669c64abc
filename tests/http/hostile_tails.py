"""Hostile tails, in a process of their own (test_fair_filters.py): N clients
of one token, each tailing a stream with a backtracking ``where=`` again and
again; a refused one waits its Retry-After, as a client should.

    python -m tests.http.hostile_tails URL TOKEN PATH WHERE N

Prints one JSON line once every client has had its first answer, and its
counts when its stdin closes (then it exits). In a process of its own, its
clients cost the measuring test nothing (no GIL shared with it), and at the
lowest priority, little of the machine's cores.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading

import httpx
import orjson


async def main(url: str, token: str, path: str, where: str, clients: int) -> None:
    counts = {"answered": 0, "accepted": 0, "refused": 0, "filter_failed": 0}
    loop = asyncio.get_running_loop()
    stdin_closed = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stdin_closed.set)),
                     daemon=True).start()

    async def client(http: httpx.AsyncClient) -> None:
        first = True
        while True:
            params = {"after": 0, "where": where}
            async with http.stream("GET", f"/v1/streams{path}/-/tail", params=params) as response:
                if first:
                    first = False
                    counts["answered"] += 1
                    if counts["answered"] == clients:
                        print(orjson.dumps({"all_answered": True, **counts}).decode(), flush=True)
                if response.status_code == 429:
                    counts["refused"] += 1
                    await response.aread()
                    # At least Retry-After, spread as client libraries spread retries.
                    await asyncio.sleep(float(response.headers["Retry-After"]) * random.uniform(1, 1.5))
                    continue
                if response.status_code != 200:
                    raise RuntimeError(f"a tail answered {response.status_code}")
                counts["accepted"] += 1
                async for line in response.aiter_lines():
                    if "filter_failed" in line:
                        counts["filter_failed"] += 1
                        break

    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients + 2)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as http:
        tasks = [asyncio.ensure_future(client(http)) for _ in range(clients)]
        await stdin_closed.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(orjson.dumps(counts).decode(), flush=True)


if __name__ == "__main__":
    # The attacker's machine, in a real attack: here it shares the test's
    # cores, and what it costs them is not the server's doing.
    os.nice(19)
    url, token, path, where, clients = sys.argv[1:6]
    asyncio.run(main(url, token, path, where, int(clients)))
