#!/usr/bin/env python
"""Filter benchmark: what ``where=`` filters cost, and what they cost others.

Against a real ``yoke serve`` (started here, ``YOKE_ACCESS_LOG=0``), per
backend:

(1) cheap filters: ``--events`` (20,000) events appended to one stream of
    tenant ``bench-b`` (``payload.amount`` = 0..19) and the stream closed;
    then ``--cheap-tails`` (10) tails from offset 0 at once, with
    ``where=payload.amount > 10``, each read to the final ``closed`` event
    (9,000 events each). Figures: wall time, events filtered per second
    (tails x events / wall time) and CPU time per event scanned (from
    /proc) of the server process (reading, filtering on the event loop,
    sending) and of its evaluator processes, if any; the same without
    ``where=`` for comparison.
(2) hostile filters: tenant ``bench-a`` holds 5 events with ``payload.s`` =
    40 a's and a b, and ``--hostile`` (20) clients of one read token each
    tail it with ``where=$contains(payload.s, /(a|aa)+$/)`` (each evaluation
    backtracks until it is cut off at 1 s of CPU), again and again (a
    refused tail waits its Retry-After, spread a little), from a process of
    their own at the lowest priority (in an attack they are on other
    machines). Meanwhile tenant ``bench-b`` appends one event after
    another on one connection and ``/healthz`` is asked every 20 ms on
    another: ``--seconds`` (12) of that with the hostile clients and as
    long without them, in ``--rounds`` (3) alternating rounds (other work
    on shared cores makes the machine's speed vary). Figures: p50, p99 and
    max of both, with and without.

    .venv/bin/python bench/filters.py [--backend all|sqlite|postgres] [--events 20000]
                                      [--cheap-tails 10] [--hostile 20] [--seconds 12] [--rounds 3]

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from http_api import Server, backend_database, percentile, start_server, stop_server  # noqa: E402

HOSTILE_WHERE = "$contains(payload.s, /(a|aa)+$/)"
CHEAP_WHERE = "payload.amount > 10"


def new_token(db_url: str, workdir: Path, tenant: str, scopes: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "yoke.cli", "tokens", "create", "--tenant", tenant, "--scopes", scopes, "--json"],
        env={**os.environ, "YOKE_DATABASE_URL": db_url}, capture_output=True, text=True, check=True, cwd=workdir,
    )
    return orjson.loads(out.stdout)["token"]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def children_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s live child processes (the filter evaluators, if any)."""
    total = 0.0
    for child in Path(f"/proc/{pid}/task").glob("*/children"):
        for cpid in child.read_text().split():
            with contextlib.suppress(OSError):
                total += cpu_s(int(cpid))
    return total


async def tail_to_end(client: httpx.AsyncClient, path: str, where: str | None) -> tuple[int, str]:
    """Events received and how the tail ended (closed, error code, or a status)."""
    params: dict[str, Any] = {"after": 0}
    if where is not None:
        params["where"] = where
    received = 0
    async with client.stream("GET", f"/v1/streams{path}/-/tail", params=params) as response:
        if response.status_code != 200:
            await response.aread()
            return 0, str(response.status_code)
        event = ""
        async for line in response.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                if event == "closed":
                    return received, "closed"
                if event == "error":
                    return received, orjson.loads(line[6:])["error"]["code"]
                received += 1
            elif not line:
                event = ""
    return received, "eof"


async def cheap(server: Server, token: str, events: int, tails: int) -> dict[str, Any]:
    path = "/cheap"
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as client:
        for start in range(0, events, 1000):
            batch = [{"type": "order", "payload": {"amount": i % 20, "note": "x" * 40}}
                     for i in range(start, min(events, start + 1000))]
            (await client.post(f"/v1/streams{path}/-/events", json=batch)).raise_for_status()
        (await client.post(f"/v1/streams{path}/-/close")).raise_for_status()
    out: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=tails + 4)
    for name, where in (("unfiltered", None), ("where", CHEAP_WHERE)):
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=300, limits=limits) as client:
            await tail_to_end(client, path, where)  # warm: pages cached by the OS, expression compiled
            server_cpu0, evaluators_cpu0 = cpu_s(server.process.pid), children_cpu_s(server.process.pid)
            started = time.perf_counter()
            results = await asyncio.gather(*(tail_to_end(client, path, where) for _ in range(tails)))
            wall = time.perf_counter() - started
            server_cpu = cpu_s(server.process.pid) - server_cpu0
            evaluators_cpu = children_cpu_s(server.process.pid) - evaluators_cpu0
        received = sum(n for n, _ in results)
        assert all(end == "closed" for _, end in results), results
        out[name] = {
            "wall_s": round(wall, 3),
            "events_scanned_per_s": round(tails * events / wall),
            "server_cpu_us_per_event": round(server_cpu / (tails * events) * 1e6, 2),
            "evaluators_cpu_us_per_event": round(evaluators_cpu / (tails * events) * 1e6, 2),
            "received": received,
        }
    return out


async def probe(server: Server, token: str, seconds: float) -> dict[str, list[float]]:
    """Tenant bench-b's appends (one after another) and /healthz (every 20 ms), for ``seconds``."""
    headers = {"Authorization": f"Bearer {token}"}
    appends: list[float] = []
    health: list[float] = []
    stop_at = time.perf_counter() + seconds

    async def append() -> None:
        async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as client:
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                (await client.post("/v1/streams/probe/-/events", json={"type": "p", "payload": {}})).raise_for_status()
                appends.append(time.perf_counter() - t)

    async def healthz() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            while time.perf_counter() < stop_at:
                t = time.perf_counter()
                (await client.get("/healthz")).raise_for_status()
                health.append(time.perf_counter() - t)
                await asyncio.sleep(0.02)

    await asyncio.gather(append(), healthz())
    return {"appends": appends, "healthz": health}


def figures(values: list[float]) -> dict[str, Any]:
    values = sorted(values)
    return {
        "n": len(values), "p50_ms": round(percentile(values, 0.5) * 1000, 2),
        "p99_ms": round(percentile(values, 0.99) * 1000, 2), "max_ms": round(values[-1] * 1000, 2),
    }


async def attack(url: str, token: str, clients: int) -> None:
    """The hostile clients (``--attack``, in a process of their own): each
    tails with HOSTILE_WHERE again and again; a refused one waits its
    Retry-After, spread a little as client libraries do. Runs until stdin
    closes, then prints how the tails ended (one JSON line)."""
    ends: dict[str, int] = {}
    loop = asyncio.get_running_loop()
    stdin_closed = asyncio.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(stdin_closed.set)),
                     daemon=True).start()

    answered = 0

    async def attacker(client: httpx.AsyncClient) -> None:
        nonlocal answered
        first = True
        while True:
            params = {"after": 0, "where": HOSTILE_WHERE}
            async with client.stream("GET", "/v1/streams/hostile/-/tail", params=params) as response:
                if first:
                    first, answered = False, answered + 1
                    if answered == clients:
                        print("ready", flush=True)  # every client has had its first answer
                if response.status_code == 429:
                    ends["429"] = ends.get("429", 0) + 1
                    await response.aread()
                    await asyncio.sleep(float(response.headers.get("Retry-After", "1")) * random.uniform(1, 1.5))
                    continue
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and '"error"' in line:
                        code = orjson.loads(line[6:])["error"]["code"]
                        ends[code] = ends.get(code, 0) + 1
                        break

    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300, limits=limits) as client:
        tasks = [asyncio.create_task(attacker(client)) for _ in range(clients)]
        await stdin_closed.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(json.dumps(ends), flush=True)


async def hostile(server: Server, token_a: str, token_b: str, clients: int, seconds: float,
                  rounds: int) -> dict[str, Any]:
    """``rounds`` of the probe without the attackers, then with them (once
    each has had its first answer): both see the same moments of the
    machine's load, which other work on shared cores makes vary."""
    headers = {"Authorization": f"Bearer {token_a}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as client:
        batch = [{"type": "s", "payload": {"s": "a" * 40 + "b"}} for _ in range(5)]
        (await client.post("/v1/streams/hostile/-/events", json=batch)).raise_for_status()
    alone: dict[str, list[float]] = {"appends": [], "healthz": []}
    loaded: dict[str, list[float]] = {"appends": [], "healthz": []}
    ends: dict[str, int] = {}
    for _ in range(rounds):
        for name, values in (await probe(server, token_b, seconds / rounds)).items():
            alone[name] += values
        # The attackers in a process of their own at the lowest priority: in
        # an attack they are on other machines; here they share the cores.
        attackers = subprocess.Popen(
            ["nice", "-n", "19", sys.executable, __file__, "--attack", server.url, token_a, str(clients)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        try:
            await asyncio.to_thread(attackers.stdout.readline)  # ready
            for name, values in (await probe(server, token_b, seconds / rounds)).items():
                loaded[name] += values
        finally:
            attackers.stdin.close()
            out = await asyncio.to_thread(attackers.stdout.read)
            attackers.wait(60)
        for end, count in json.loads(out or "{}").items():
            ends[end] = ends.get(end, 0) + count
    return {
        "without_hostile": {name: figures(values) for name, values in alone.items()},
        "with_hostile": {name: figures(values) for name, values in loaded.items()},
        "hostile_tail_ends": ends,
    }


def run(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="yoke-bench-filters-") as tmp:
        workdir = Path(tmp)
        with backend_database(backend, workdir) as db_url:
            server = start_server(db_url, workdir)
            try:
                token_a = new_token(db_url, workdir, "bench-a", "read,append")
                token_b = new_token(db_url, workdir, "bench-b", "read,append,admin")
                return {
                    "cheap": asyncio.run(cheap(server, token_b, args.events, args.cheap_tails)),
                    "hostile": asyncio.run(
                        hostile(server, token_a, token_b, args.hostile, args.seconds, args.rounds)
                    ),
                }
            finally:
                stop_server(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="sqlite", choices=["all", "sqlite", "postgres"])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--cheap-tails", type=int, default=10)
    parser.add_argument("--hostile", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--attack", nargs=3, metavar=("URL", "TOKEN", "CLIENTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.attack:
        url, token, clients = args.attack
        asyncio.run(attack(url, token, int(clients)))
        return
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    figures = {}
    for backend in backends:
        figures[backend] = result = run(backend, args)
        for part, value in result.items():
            print(f"{backend} {part}: {json.dumps(value)}", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
