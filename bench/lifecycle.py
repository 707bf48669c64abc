#!/usr/bin/env python
"""Lifecycle facts benchmark: what recording them on '/' costs.

(a) stream creation: ``--streams`` new streams created by their first
    append, ``--concurrency`` at a time. Each creation also appends a
    ``yoke.stream.created`` fact to the tenant's global stream '/' in the
    same transaction (so creations in one tenant serialize on '/').
    Streams created per second.
(b) the same streams' second append (no fact), the same way: appends per
    second, the reference for (a).
(c) session connections: open and close ``--connections`` connections one
    after the other (each records connection_opened and connection_closed
    on '/'): connections per second.

    python bench/lifecycle.py [--backend all|postgres|sqlite] [--streams 2000] [--concurrency 50]
                              [--connections 500]

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yoke  # noqa: E402

from append import scratch  # noqa: E402

TENANT = "bench"


async def appends(y: yoke.Runtime, paths: list[str], concurrency: int, kind: str) -> float:
    """Each path appended to once, ``concurrency`` at a time: appends/s."""
    queue = list(reversed(paths))

    async def worker() -> None:
        while queue:
            path = queue.pop()
            await y.stream(path, TENANT).append({"type": kind})

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(paths) / (time.perf_counter() - start)


async def connections(y: yoke.Runtime, count: int) -> float:
    stream = y.stream("/watched", TENANT)
    await stream.append({"type": "x"})

    async def on_batch(batch) -> None:  # noqa: ANN001
        return None

    start = time.perf_counter()
    for i in range(count):
        connection = await stream.open_connection(connection_key=f"k{i}", on_batch=on_batch)
        await connection.close()
    return count / (time.perf_counter() - start)


async def run(backend: str, args: argparse.Namespace) -> dict[str, float]:
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, data_dir=str(folder), executor=False) as y:
            paths = [f"/s/{i}" for i in range(args.streams)]
            created = await appends(y, paths, args.concurrency, "first")
            again = await appends(y, paths, args.concurrency, "second")
            facts = [e for e in await y.stream("/", TENANT).read(limit=10_000) if e.type == "yoke.stream.created"]
            figures = {
                "streams_created_per_s": created, "appends_to_existing_per_s": again,
                "created_facts": len(facts),  # 0 on a build without lifecycle facts (a before figure)
            }
            if args.connections:
                figures["connections_per_s"] = await connections(y, args.connections)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="all", choices=["all", "postgres", "sqlite"])
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--connections", type=int, default=500, help="0: skip (c), e.g. on an older build")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    results = {}
    for backend in backends:
        figures = asyncio.run(run(backend, args))
        results[backend] = figures
        print(f"{backend:9} " + "  ".join(f"{k} {v:,.0f}" for k, v in figures.items()), flush=True)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
