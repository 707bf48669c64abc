#!/usr/bin/env python
"""Latency of one keyed actor whose process() writes with ``ctx.sqlite``
(``--op sqlite``; ``state``: ``ctx.state.set``; ``none``: nothing), and how
soon ``wait_idle()`` sees it done. One instance, concurrency 1, the default
scheduler (two claim shards, ``--sweep`` 1 s), each backend in a fresh
database:

(a) idle: ``--samples`` (100) single-event appends, each once the system is
    idle: append -> process() started, append -> process() returned, and
    append -> ``wait_idle()`` returned (the row's completion and every claim
    loop quiet). A sweep's worth here is a loop that missed its wake-up.
(b) chain: ``--samples`` appends, each as soon as the previous process()
    returned (no wait_idle): the next run can only be claimed once the
    previous row's completion is written, so append -> process() started
    includes that completion.
(c) burst: ``--burst`` (200) events to the one instance in one
    ``append_many``: events/s to the last process() returning (each run
    waits for the previous row's completion).

    python bench/idle_latency.py [--backend all|sqlite|postgres] [--op sqlite|state|none]
                                 [--samples N] [--burst N] [--sweep S]

PostgreSQL: a scratch database on YOKE_BENCH_PG_URL (bench/append.py).
The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import yoke
from append import scratch  # bench/append.py (scripts run from bench/)
from yoke import App, Filter

WARMUP = 5


class Probe:
    def __init__(self) -> None:
        self.runs: dict[int, tuple[float, float]] = {}  # sample -> (started, returned)
        self.waiters: dict[int, asyncio.Future[None]] = {}


def make_app(op: str, probe: Probe) -> App:
    app = App()

    @app.actor("bench", filter=Filter(types=["bench.work"], key="payload.k"), concurrency=1, timeout_s=30)
    async def process(ctx, event) -> None:  # noqa: ANN001
        started = time.perf_counter()
        n = event.payload["n"]
        if op == "sqlite":
            await ctx.sqlite.exec("CREATE TABLE IF NOT EXISTS seen (n INTEGER)")
            await ctx.sqlite.exec("INSERT INTO seen VALUES (?)", [n])
        elif op == "state":
            await ctx.state.set({"n": n})
        probe.runs[n] = (started, time.perf_counter())
        waiter = probe.waiters.pop(n, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    return app


def pcts(values: list[float]) -> dict[str, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(cuts[49], 2), "p99": round(cuts[98], 2), "max": round(max(values), 2)}


async def measure(backend: str, op: str, samples: int, burst: int, sweep: float) -> dict[str, Any]:
    probe = Probe()
    loop = asyncio.get_running_loop()
    result: dict[str, Any] = {"backend": backend, "op": op, "samples": samples}
    async with scratch(backend) as (url, folder):
        async with yoke.open(url, app=make_app(op, probe), data_dir=str(folder), scheduler_sweep_s=sweep) as y:
            stream = y.stream("/bench")
            n = 0

            async def one() -> tuple[float, float]:
                nonlocal n
                n += 1
                waiter = probe.waiters[n] = loop.create_future()
                before = time.perf_counter()
                await stream.append({"type": "bench.work", "payload": {"k": "one", "n": n}})
                await asyncio.wait_for(waiter, 30)
                return before, time.perf_counter()

            # (a) idle
            start_ms, run_ms, idle_ms = [], [], []
            for s in range(WARMUP + samples):
                before, _ = await one()
                await y.wait_idle(timeout_s=30)
                idle = time.perf_counter()
                if s >= WARMUP:
                    started, returned = probe.runs[n]
                    start_ms.append((started - before) * 1000)
                    run_ms.append((returned - before) * 1000)
                    idle_ms.append((idle - before) * 1000)
            result["idle_start_ms"] = pcts(start_ms)
            result["idle_returned_ms"] = pcts(run_ms)
            result["idle_wait_idle_ms"] = pcts(idle_ms)
            result["idle_wait_idle_slow"] = sum(v > sweep * 500 for v in idle_ms)  # over half a sweep
            # (b) chain
            chain_ms = []
            for s in range(WARMUP + samples):
                before, _ = await one()
                if s >= WARMUP:
                    chain_ms.append((probe.runs[n][0] - before) * 1000)
            result["chain_start_ms"] = pcts(chain_ms)
            await y.wait_idle(timeout_s=30)
            # (c) burst
            first = n + 1
            n += burst
            last = probe.waiters[n] = loop.create_future()
            t0 = time.perf_counter()
            await stream.append_many(
                [{"type": "bench.work", "payload": {"k": "one", "n": i}} for i in range(first, n + 1)]
            )
            await asyncio.wait_for(last, 120)
            result["burst_eps"] = round(burst / (time.perf_counter() - t0))
            await y.wait_idle(timeout_s=30)
    return result


def show(r: dict[str, Any]) -> None:
    name = f"{r['backend']:8} op={r['op']:6}"
    for key in ("idle_start_ms", "idle_returned_ms", "idle_wait_idle_ms", "chain_start_ms"):
        v = r[key]
        print(f"{name} {key:18} p50 {v['p50']:8.2f}  p99 {v['p99']:8.2f}  max {v['max']:8.2f}")
    print(f"{name} wait_idle_slow     {r['idle_wait_idle_slow']} of {r['samples']} over half a sweep")
    print(f"{name} burst_eps          {r['burst_eps']}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="all", choices=["all", "sqlite", "postgres"])
    parser.add_argument("--op", default="sqlite", help="comma-separated: sqlite, state, none")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--sweep", type=float, default=1.0, help="scheduler_sweep_s")
    args = parser.parse_args()
    backends = ["sqlite", "postgres"] if args.backend == "all" else [args.backend]
    results = []
    for backend in backends:
        for op in args.op.split(","):
            r = await measure(backend, op, args.samples, args.burst, args.sweep)
            show(r)
            results.append(r)
    print(json.dumps(results))


if __name__ == "__main__":
    asyncio.run(main())
