#!/usr/bin/env python
"""Batch appends through the public API: the store's side of the Durable
Streams bench's (b), without HTTP.

64 producers (asyncio tasks) each append batches of 100 events of about
256 bytes (``Stream.append_many``) to 100 streams in turn, for ``--seconds``;
or, with ``--protocol``, as the Durable Streams route does (the batch a
JSON body, its messages made events by the route's ``events_of``, appended
with ``AppendService.append_protocol``, which answers with the last offset);
prints events/s and the process's CPU time per event (user + system, every
thread: the event loop's and the SQLite writer's), which this 2-core machine's
drift moves far less than events/s.

    .venv/bin/python bench/append_batches.py [--backend sqlite|postgres] [--protocol] [--seconds 6] [--runs 3]

PostgreSQL runs in a scratch database made through YOKE_BENCH_PG_URL (see
bench/append.py); SQLite in a temporary directory. The last line printed is
one JSON object with every run's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from append import scratch  # bench/append.py (scripts run from bench/)  # noqa: E402

import orjson  # noqa: E402

import yoke  # noqa: E402
from yoke.http.durable_streams.messages import events_of  # noqa: E402

PRODUCERS = 64
STREAMS = 100
BATCH = 100


def batch() -> list[dict]:
    return [{"type": "message", "payload": {"n": n, "at": 1764600000000, "pad": "x" * 220}} for n in range(BATCH)]


async def one_run(backend: str, seconds: float, protocol: bool) -> dict[str, float]:
    async with scratch(backend) as (url, _), yoke.open(url) as y:
        streams = [y.stream(f"/bench/{i}") for i in range(STREAMS)]
        for s in streams:
            await s.append({"type": "created"})
        appended = 0
        deadline = time.perf_counter() + seconds

        body = orjson.dumps([e["payload"] for e in batch()])

        async def producer(p: int) -> None:
            nonlocal appended
            i = p
            while time.perf_counter() < deadline:
                stream = streams[i % STREAMS]
                if protocol:
                    await y.appends.append_protocol(stream.tenant, stream.path, events_of(body, "application/json"), None)
                else:
                    await stream.append_many(batch())
                appended += BATCH  # after the await: += across one would lose other tasks' counts
                i += PRODUCERS

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(producer(p) for p in range(PRODUCERS)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    return {"events_per_s": round(appended / elapsed), "cpu_us_per_event": round(cpu / appended * 1e6, 2)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--protocol", action="store_true", help="append as the Durable Streams route does")
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    runs = []
    for n in range(args.runs):
        figures = await one_run(args.backend, args.seconds, args.protocol)
        print(f"{args.backend}{' protocol' if args.protocol else ''} run {n + 1}: {figures['events_per_s']:,} events/s, "
              f"{figures['cpu_us_per_event']} us CPU per event", flush=True)
        runs.append(figures)
    print(json.dumps({"backend": args.backend, "protocol": args.protocol, "runs": runs}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
